package compute_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/better-compute/better-compute/controlplane/compute"
	"github.com/better-compute/better-compute/controlplane/config"
)

// Before Run the handler answers 503 UNAVAILABLE; a bad role and split
// roles on SQLite are refused before anything starts; Run runs once.
func TestRefusals(t *testing.T) {
	if _, err := compute.New(compute.Config{}); err == nil {
		t.Fatal("New without a configuration: no error")
	}
	cfg, err := config.Load("", func(string) string { return "" }, config.Flags{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := compute.New(compute.Config{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	cp.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/nodes/list", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("before Run: %d %v %s, want 503 with Retry-After", rec.Code, rec.Header(), rec.Body)
	}
	if err := cp.Run(context.Background(), []string{"api"}); err == nil {
		t.Fatal("Run api alone on the embedded SQLite default: no error")
	}
	if err := cp.Run(context.Background(), []string{"nope"}); err == nil {
		t.Fatal("Run with an unknown role: no error")
	}
	cfg.Host.Gateway.Listen = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx, nil) }()
	select {
	case <-cp.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	if err := cp.Run(ctx, nil); !errors.Is(err, compute.ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
}
