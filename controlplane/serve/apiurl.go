package serve

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/better-compute/better-compute/controlplane/bootstrap"
)

// writeAPIURL records url in dataDir/bootstrap.APIURLFile (0600, replaced
// whole), for the CLI and doctor on this machine.
func writeAPIURL(dataDir, url string) error {
	if dataDir == "" {
		return nil
	}
	if _, err := os.Stat(dataDir); errors.Is(err, fs.ErrNotExist) {
		// A deployment on PostgreSQL need not have a data directory on
		// every machine: nothing to record, no CLI reads it there.
		return nil
	}
	path := filepath.Join(dataDir, bootstrap.APIURLFile)
	tmp, err := os.CreateTemp(dataDir, ".api-url-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := fmt.Fprintln(tmp, url); err != nil {
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
