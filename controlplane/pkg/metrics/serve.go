package metrics

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/accept"
)

// MinTokenLen is the shortest bearer token that enables /metrics
// (host.metrics.bearerToken).
const MinTokenLen = 16

// MaxProfileSeconds is the longest CPU profile or execution trace
// /debug/pprof/ runs for one request.
const MaxProfileSeconds = 300

// Mount serves h at GET /metrics on mux, only to requests carrying
// "Authorization: Bearer <token>", and with withPprof the Go runtime's
// profiles (net/http/pprof) under GET /debug/pprof/ behind the same token.
// A token shorter than MinTokenLen mounts nothing and returns false: the
// routes do not exist (404).
func Mount(mux *http.ServeMux, h http.Handler, token string, withPprof bool) bool {
	if h == nil || len(token) < MinTokenLen {
		return false
	}
	want := sha256.Sum256([]byte(token))
	mux.Handle("GET /metrics", &bearer{want: want, next: h})
	if withPprof {
		// pprof.Index serves the named profiles (heap, goroutine, allocs,
		// ...) below it; profile and trace run for ?seconds=N.
		mux.Handle("GET /debug/pprof/", &bearer{want: want, next: http.HandlerFunc(pprof.Index)})
		mux.Handle("GET /debug/pprof/profile", &bearer{want: want, next: boundedSeconds(pprof.Profile)})
		mux.Handle("GET /debug/pprof/trace", &bearer{want: want, next: boundedSeconds(pprof.Trace)})
		mux.Handle("GET /debug/pprof/symbol", &bearer{want: want, next: http.HandlerFunc(pprof.Symbol)})
	}
	return true
}

// ListenConfig configures a metrics listener of its own
// (host.metrics.listen), for processes without the api role.
type ListenConfig struct {
	// Addr is the address to listen on, such as 0.0.0.0:9464. Required.
	Addr string
	// Token is host.metrics.bearerToken; at least MinTokenLen characters.
	Token string
	// Pprof also serves the profiles (host.metrics.pprof).
	Pprof bool
	// Ready, when set, is called with the bound address once it listens.
	Ready func(net.Addr)
	// Listeners watches the listener: accepts back off on temporary
	// errors (internal/accept). Defaults to none (back-off only).
	Listeners *accept.Watch
}

// Serve serves m's /metrics (and the profiles with Pprof) on a listener of
// its own, plain HTTP, until ctx ends. It fails when the token is too
// short or the address cannot be bound.
func (m *Metrics) Serve(ctx context.Context, cfg ListenConfig) error {
	mux := http.NewServeMux()
	if !Mount(mux, m.Handler(), cfg.Token, cfg.Pprof) {
		return fmt.Errorf("metrics listener %s: host.metrics.bearerToken must be at least %d characters", cfg.Addr, MinTokenLen)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("metrics listen on %s: %w", cfg.Addr, err)
	}
	ln = cfg.Listeners.Wrap("metrics", ln)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(m.cfg.Log.Handler(), slog.LevelWarn)}
	m.cfg.Log.InfoContext(ctx, "Metrics listening", "addr", ln.Addr().String())
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("metrics shutdown: %w", err)
	}
	return nil
}

// boundedSeconds refuses a ?seconds= that is not a whole number from 1 to
// MaxProfileSeconds (400), so that no request holds the profiler for hours.
func boundedSeconds(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n < 1 || n > MaxProfileSeconds {
				http.Error(w, fmt.Sprintf("seconds=%q: want a whole number from 1 to %d", v, MaxProfileSeconds), http.StatusBadRequest)
				return
			}
		}
		h(w, r)
	})
}

// bearer lets through only requests carrying the token, compared in
// constant time (over SHA-256 digests, so not even the length leaks).
type bearer struct {
	want [sha256.Size]byte
	next http.Handler
}

func (b *bearer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token := ""
	scheme, t, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		token = strings.TrimSpace(t)
	}
	got := sha256.Sum256([]byte(token))
	if token == "" || subtle.ConstantTimeCompare(got[:], b.want[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="metrics"`)
		http.Error(w, "unauthorized: send Authorization: Bearer <host.metrics.bearerToken>", http.StatusUnauthorized)
		return
	}
	b.next.ServeHTTP(w, r)
}
