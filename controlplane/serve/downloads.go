package serve

import (
	"log/slog"
	"net/http"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/downloads"
)

// downloadsHandler returns the downloads route's handler when downloads.dir
// is configured (nil otherwise) and the function that closes it.
func downloadsHandler(cfg *config.Config, log *slog.Logger) (http.Handler, func(), error) {
	if cfg.Downloads.Dir == "" {
		return nil, func() {}, nil
	}
	h, err := downloads.New(downloads.Config{Dir: cfg.Downloads.Dir, BasePath: cfg.BasePath, Log: log})
	if err != nil {
		return nil, nil, err
	}
	log.Info("Serving downloads", "dir", cfg.Downloads.Dir, "path", cfg.BasePath+"/downloads/")
	return h, func() { _ = h.Close() }, nil
}
