package upgrade

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Files under Config.DataDir.
const (
	// stateDir holds the upgrade's files.
	stateDir = "upgrade"
	// markerFile is the pending-upgrade marker.
	markerFile = "pending.json"
	// resultFile records the result of the last upgrade that restarted bcd.
	resultFile = "result.json"
	// releaseDir holds the signed manifest of the installed release (the
	// install script writes it first).
	releaseDir = "release"
)

// States of a Marker.
const (
	// stateSwapped: the new binary is in place; it has not been tried.
	stateSwapped = "swapped"
	// statePassed: the new binary connected in its trial; bcd restarted
	// into it.
	statePassed = "passed"
	// stateRolledBack: the previous binary is back in place.
	stateRolledBack = "rolled-back"
)

// Marker is the pending-upgrade marker, DataDir/upgrade/pending.json. It is
// written before the binary is swapped and removed by the first Welcome
// after the restart.
type Marker struct {
	// CommandID is the upgrade command's id.
	CommandID string `json:"command_id"`
	// From and To are the versions before and after.
	From string `json:"from"`
	To   string `json:"to"`
	// Target is the installed binary; Target+".prev" is From.
	Target string `json:"target"`
	// State is swapped, passed or rolled-back.
	State string `json:"state"`
	// Starts counts the starts of the new binary since the swap.
	Starts int `json:"starts"`
	// Reason says why the upgrade rolled back.
	Reason string `json:"reason,omitempty"`
	// CreatedAt is when the upgrade began.
	CreatedAt time.Time `json:"created_at"`
}

// record is the result of the last upgrade that restarted bcd,
// DataDir/upgrade/result.json: the restarted bcd answers the command's
// redelivery with it.
type record struct {
	CommandID string          `json:"command_id"`
	Succeeded bool            `json:"succeeded"`
	Error     string          `json:"error,omitempty"`
	Detail    json.RawMessage `json:"detail,omitempty"`
	Finished  time.Time       `json:"finished_at"`
}

// Detail is the structured result of an upgrade command (its detail_json).
type Detail struct {
	// From is the version bcd ran before; To the one asked for.
	From string `json:"from"`
	To   string `json:"to"`
	// RolledBack is set when the new version failed to start and From was
	// restored.
	RolledBack bool `json:"rolled_back,omitempty"`
}

func (r *record) result() *sessionv1.CommandResult {
	res := &sessionv1.CommandResult{CommandId: r.CommandID, DetailJson: r.Detail, FinishedAt: timestamppb.New(r.Finished)}
	if r.Succeeded {
		res.State = sessionv1.CommandState_COMMAND_STATE_SUCCEEDED
	} else {
		res.State, res.ExitCode, res.Error = sessionv1.CommandState_COMMAND_STATE_FAILED, -1, r.Error
	}
	return res
}

// files are the upgrade's files under a data directory.
type files struct{ dir string }

func (f files) path(name string) string { return filepath.Join(f.dir, stateDir, name) }

func (f files) readMarker() (*Marker, error) {
	var m Marker
	if err := readJSON(f.path(markerFile), &m); err != nil {
		return nil, err
	}
	return &m, nil
}

func (f files) writeMarker(m *Marker) error { return writeJSON(f.path(markerFile), m) }

func (f files) removeMarker() error {
	if err := os.Remove(f.path(markerFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove upgrade marker: %w", err)
	}
	return nil
}

func (f files) readRecord() (*record, error) {
	var r record
	if err := readJSON(f.path(resultFile), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func (f files) writeRecord(r *record) error { return writeJSON(f.path(resultFile), r) }

// readJSON reads a JSON file; a missing one is os.ErrNotExist.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

// writeJSON writes a JSON file atomically (0600).
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(path, append(b, '\n'))
}

// writeFile writes a file atomically and durably (0600), making its folder
// (0700) when needed.
func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	syncDir(filepath.Dir(path))
	return nil
}
