package nodestate

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// File is the state file's name in the data directory.
const File = "state.json"

// Version is the layout version of File this package writes and reads.
const Version = 1

// DefaultReattestGrace is the re-attestation grace assumed while the
// gateway's is not known: the control plane's default pki.reattestGrace.
const DefaultReattestGrace = 7 * 24 * time.Hour

// Where a State's ReattestGraceSeconds came from.
const (
	// GraceFromGateway: the gateway sent it (reattest_grace of a Join or
	// Renew answer).
	GraceFromGateway = "gateway"
	// GraceFromDefault: DefaultReattestGrace, assumed.
	GraceFromDefault = "default"
)

// ErrNoState reports a data directory without a state file: bcd node has
// never run there (or runs a build that writes none).
var ErrNoState = errors.New("no bcd node state")

// State is what a running bcd node reports about itself: the content of
// File.
type State struct {
	// Version is the layout version, Version.
	Version int `json:"version"`
	// PID is the process id of the bcd node that wrote the file.
	PID int `json:"pid"`
	// UpdatedAt is when the file was written.
	UpdatedAt time.Time `json:"updated_at"`
	// Connected reports whether the node holds a session (a Welcome
	// arrived and the session has not ended).
	Connected bool `json:"connected"`
	// Since is when the node connected, or when it lost its session (when
	// the agent started, before its first session).
	Since time.Time `json:"since"`
	// Gateway is the URL of the gateway connected to, or of the last one
	// tried.
	Gateway string `json:"gateway,omitempty"`
	// SessionID is the session's id (Welcome.session_id) while connected.
	SessionID string `json:"session_id,omitempty"`
	// LastError is the last error of a connection attempt, a session or a
	// renewal, on one line; empty when there has been none.
	LastError string `json:"last_error,omitempty"`
	// LastErrorAt is when LastError happened.
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// CertNotAfter is the end of the node certificate's validity.
	CertNotAfter time.Time `json:"cert_not_after"`
	// CertRenewAfter is when the certificate is due for renewal.
	CertRenewAfter time.Time `json:"cert_renew_after"`
	// ReattestGraceSeconds is how long after CertNotAfter a gateway still
	// re-attests the node, in seconds; 0 when re-attestation is off.
	ReattestGraceSeconds int64 `json:"reattest_grace_seconds"`
	// ReattestGraceFrom is GraceFromGateway or GraceFromDefault.
	ReattestGraceFrom string `json:"reattest_grace_from"`
	// ReattestDeadline is CertNotAfter + the grace: after it only a
	// new join brings the node back.
	ReattestDeadline time.Time `json:"reattest_deadline"`
	// ClockSkewSeconds is this machine's clock minus the gateway's, in
	// whole seconds, as bcd node last measured it from the gateway's
	// answers; 0 when they agreed within a minute, or before any answer.
	// The certificate is judged by the gateway's time (Report.GatewayNow).
	ClockSkewSeconds int64 `json:"clock_skew_seconds,omitempty"`
}

// Skew returns ClockSkewSeconds as a duration.
func (s *State) Skew() time.Duration { return time.Duration(s.ClockSkewSeconds) * time.Second }

// Grace returns ReattestGraceSeconds as a duration.
func (s *State) Grace() time.Duration { return time.Duration(s.ReattestGraceSeconds) * time.Second }

// Line is the state on one line, as systemd's STATUS= shows it:
// "connected to <gateway> since <time>", or "disconnected since <time>:
// <last error>; certificate valid until <time>" (times RFC 3339, UTC).
func (s *State) Line() string {
	if s.Connected {
		return fmt.Sprintf("connected to %s since %s", s.Gateway, stamp(s.Since))
	}
	return fmt.Sprintf("disconnected since %s: %s; certificate valid until %s",
		stamp(s.Since), cmp.Or(s.LastError, "not connected yet"), stamp(s.CertNotAfter))
}

// OneLine returns err's message on one line (whitespace runs, newlines
// included, become one space), as LastError keeps it; "" for nil.
func OneLine(err error) string {
	if err == nil {
		return ""
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Path returns the state file's path in data directory dir.
func Path(dir string) string { return filepath.Join(dir, File) }

// Write replaces the state file in dir with s, atomically (a temporary file
// in dir, mode 0644, fsync, rename). It sets s.Version.
func Write(dir string, s *State) (err error) {
	s.Version = Version
	raw, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("write node state: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+File+".tmp-*")
	if err != nil {
		return fmt.Errorf("write node state: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("write node state: %w", err)
		}
	}()
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if _, err = f.Write(append(raw, '\n')); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, Path(dir))
}

// Read reads the state file in dir. It fails with ErrNoState when there is
// none.
func Read(dir string) (*State, error) {
	raw, err := os.ReadFile(Path(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNoState, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("read node state: %w", err)
	}
	var s State
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("read node state %s: %w", Path(dir), err)
	}
	if s.Version != Version {
		return nil, fmt.Errorf("read node state %s: layout version %d, this bcd reads %d", Path(dir), s.Version, Version)
	}
	return &s, nil
}

// stamp formats t as RFC 3339 in UTC, to the second.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
