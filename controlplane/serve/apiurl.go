package serve

import (
	"fmt"
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
