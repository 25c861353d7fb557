package serve

import (
	"fmt"
	"os"
	"path/filepath"
)

// APIURLFile, in the data directory, holds the URL a CLI on this machine
// reaches the running API by, with its base path (https://127.0.0.1:3000/api
// when the API serves TLS, http:// otherwise), written each time the API starts listening. The
// CLI reads it when no --server, BETTER_COMPUTE_URL or configuration names
// the server, so `better-compute nodes add` works beside `serve
// --public-url` without flags.
const APIURLFile = "api-url"

// writeAPIURL records url in dataDir/APIURLFile (0600, replaced whole).
func writeAPIURL(dataDir, url string) error {
	if dataDir == "" {
		return nil
	}
	path := filepath.Join(dataDir, APIURLFile)
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
