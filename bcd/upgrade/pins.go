package upgrade

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/installer/manifest"
)

// ErrLastPin: a pin statement would remove the last pin of the file, after
// which no release could be verified on this machine.
var ErrLastPin = errors.New("a pin statement may not remove the last release pin")

// statementMark starts the comment line that records an applied pin
// statement in the pin file ("# statement add sha256/... 2026-12-07T05:00:00Z"):
// ReadPins skips it as a comment; ApplyPinStatement reads it to refuse a
// replayed older statement about the same pin.
const statementMark = "# statement "

// PinChange is what ApplyPinStatement did.
type PinChange struct {
	// Statement is the verified statement.
	Statement *manifest.PinStatement
	// Changed is false when the file already said so (the pin present for
	// an add, absent for a remove) or the statement is not newer than the
	// last one applied for its pin.
	Changed bool
	// Stale is true when the statement was ignored because one made at or
	// after its created_at was applied for the same pin.
	Stale bool
}

// ApplyPinStatement verifies a pin statement and its signature against the
// pins in path (ReadPins) and applies it to that file: an add appends the
// pin, a remove drops it (refused with ErrLastPin when no other pin would
// remain). The file is replaced atomically with its mode and owner kept, and
// records the statement so that an older one about the same pin, replayed,
// changes nothing. Errors wrap ErrNoPins, manifest.ErrUnpinnedKey,
// manifest.ErrBadSignature, manifest.ErrPinStatement or ErrLastPin.
func ApplyPinStatement(path string, statement, sig []byte) (*PinChange, error) {
	pins, err := ReadPins(path)
	if err != nil {
		return nil, err
	}
	s, err := manifest.VerifyPinStatement(statement, sig, pins)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read release pins: %w", err)
	}
	var lines []string
	var last time.Time // the latest statement applied for s.Pin
	present := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		trimmed := strings.TrimSpace(line)
		if trimmed == s.Pin {
			present = true
		}
		if f := strings.Fields(strings.TrimPrefix(trimmed, statementMark)); strings.HasPrefix(trimmed, statementMark) && len(f) == 3 && f[1] == s.Pin {
			if at, err := time.Parse(time.RFC3339, f[2]); err == nil && at.After(last) {
				last = at
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read release pins: %w", err)
	}
	change := &PinChange{Statement: s}
	if !last.IsZero() && !s.CreatedAt.After(last) {
		change.Stale = true
		return change, nil
	}
	var out []string
	switch s.Action {
	case manifest.PinAdd:
		out = lines
		if !present {
			out = append(out, s.Pin)
			change.Changed = true
		}
	case manifest.PinRemove:
		if present && len(pins) == 1 {
			return nil, fmt.Errorf("%w (%s in %s)", ErrLastPin, s.Pin, path)
		}
		for _, l := range lines {
			if strings.TrimSpace(l) == s.Pin {
				change.Changed = true
				continue
			}
			out = append(out, l)
		}
	}
	out = append(out, fmt.Sprintf("%s%s %s %s", statementMark, s.Action, s.Pin, s.CreatedAt.UTC().Format(time.RFC3339)))
	if err := replaceFile(path, []byte(strings.Join(out, "\n")+"\n")); err != nil {
		return nil, fmt.Errorf("write release pins: %w", err)
	}
	return change, nil
}

// replaceFile writes data to path through a temporary file in its
// directory, keeping path's mode and (as root) its owner, and renames it
// into place.
func replaceFile(path string, data []byte) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing to remove
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(fi.Mode().Perm()); err != nil {
		tmp.Close()
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
		if err := tmp.Chown(int(st.Uid), int(st.Gid)); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	syncDir(dir)
	return nil
}
