package serve

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
)

// writeAPIURL records url in dataDir/bootstrap.APIURLFile and the bound
// address addr in bootstrap.APIListenFile (0600, each replaced whole), for
// the CLI and doctor on this machine.
func writeAPIURL(dataDir, url, addr string) error {
	if err := writeRecord(dataDir, bootstrap.APIURLFile, url); err != nil {
		return err
	}
	return writeRecord(dataDir, bootstrap.APIListenFile, addr)
}

// writeRecord writes line to dataDir/name (0600, replaced whole); nothing
// when dataDir does not exist.
func writeRecord(dataDir, name, line string) error {
	if dataDir == "" {
		return nil
	}
	if _, err := os.Stat(dataDir); errors.Is(err, fs.ErrNotExist) {
		// A deployment on PostgreSQL need not have a data directory on
		// every machine: nothing to record, no CLI reads it there.
		return nil
	}
	path := filepath.Join(dataDir, name)
	tmp, err := os.CreateTemp(dataDir, "."+name+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := fmt.Fprintln(tmp, line); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
