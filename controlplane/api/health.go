package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// healthz answers liveness: the process serves HTTP.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// MinFreeBytes is the free space under which the embedded database's
// filesystem counts as full for /readyz: less than SQLite needs to grow its
// write-ahead log by a few transactions.
const MinFreeBytes = 1 << 20

// Checker is a readiness condition of the process, such as its clock
// check (clockcheck.Gate).
type Checker interface {
	// Check returns why the process is not ready; nil when it is.
	Check() error
}

// freeBytes returns the space free to this process on dir's filesystem.
func freeBytes(dir string) (uint64, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, err
	}
	return fs.Bavail * uint64(fs.Bsize), nil
}

// readyz answers readiness: every listener of the process accepts (none
// has failed to accept for more than 10 s in a row), every expand migration
// of this build is applied (pending contract ones, and ones of a newer
// build applied while this one runs, do not count: issue 40), the store
// answers, the embedded database's filesystem has room to write and the process's clock was found right (Config.Clock). 503
// otherwise, with the reason.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	// First, and without the database: with descriptors exhausted a new
	// database connection would fail too, and the reason would be lost.
	if err := s.cfg.Listeners.Check(); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	if c := s.cfg.Clock; c != nil {
		if err := c.Check(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if dir := s.cfg.EmbeddedDir; dir != "" {
		if free, err := freeBytes(dir); err == nil && free < MinFreeBytes {
			http.Error(w, fmt.Sprintf("not ready: database disk full (%d bytes free on the filesystem of %s)", free, dir), http.StatusServiceUnavailable)
			return
		}
	}
	st, err := s.store.MigrationStatus(ctx)
	var newer *store.MigrationError
	switch {
	case errors.As(err, &newer):
		// A newer build migrated the schema while this one runs: its
		// expand migrations only add, and a contract one waits while this
		// process is registered (issue 40), so it keeps serving through a
		// rolling upgrade. A restart of this build refuses the schema.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ready\n"))
	case err != nil:
		// The database unreachable or refusing writes, as during a
		// failover: the store's pool connects again by itself (to the new
		// primary of a multi-host URL), and readiness follows.
		http.Error(w, "not ready: database unavailable: "+err.Error(), http.StatusServiceUnavailable)
	case len(st.PendingExpand()) > 0: // pending contract migrations wait for older builds (issue 40)
		http.Error(w, "not ready: pending migrations", http.StatusServiceUnavailable)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ready\n"))
	}
}

// Health is the body of GET {basePath}/health.
type Health struct {
	// Status is "ok" or "unavailable".
	Status string `json:"status"`
	// Database is "ok" or the error the store returned.
	Database string `json:"database"`
	// LatencyMs is the store's round trip in milliseconds.
	LatencyMs float64 `json:"latencyMs"`
	// Time is the server's clock, RFC 3339.
	Time time.Time `json:"time"`
}

// health pings the store and reports its latency.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err := s.store.Ping(ctx)
	h := Health{Status: "ok", Database: "ok", LatencyMs: float64(time.Since(start).Microseconds()) / 1000, Time: time.Now().UTC()}
	code := http.StatusOK
	if err != nil {
		h.Status, h.Database, code = "unavailable", err.Error(), http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(h)
}
