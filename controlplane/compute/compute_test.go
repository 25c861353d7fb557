package compute_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/compute"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
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

// headerTransport adds X-Forwarded-For to every request, as a client that
// names its own address (or a proxy) would.
type headerTransport struct{ xff string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Forwarded-For", h.xff)
	return http.DefaultTransport.RoundTrip(r)
}

// TestCallerAddress: the handler takes the caller's address from the
// connection (RemoteAddr, 127.0.0.1 here) and ignores a client's
// X-Forwarded-For, unless the peer is in trustedProxies: then the
// forwarded address is the caller's. The audit row of a mutating call
// records it.
func TestCallerAddress(t *testing.T) {
	for _, tc := range []struct {
		name, proxies, want string
	}{
		{"no trusted proxy", "", "127.0.0.1"},
		{"the peer is a trusted proxy", "trustedProxies: [\"127.0.0.1\"]\n", "203.0.113.9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "better-compute.yaml")
			if err := os.WriteFile(file, []byte(tc.proxies+"host:\n  gateway:\n    listen: 127.0.0.1:0\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load(file, func(string) string { return "" }, config.Flags{DataDir: filepath.Join(dir, "data")})
			if err != nil {
				t.Fatal(err)
			}
			cp, err := compute.New(compute.Config{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(cp.Handler())
			defer srv.Close()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- cp.Run(ctx, nil) }()
			defer func() { cancel(); <-done }()
			select {
			case <-cp.Ready():
			case err := <-done:
				t.Fatalf("Run: %v", err)
			case <-time.After(2 * time.Minute):
				t.Fatal("the api role did not start")
			}
			token, err := os.ReadFile(filepath.Join(cfg.DataDir, "admin-token"))
			if err != nil {
				t.Fatal(err)
			}
			c := &client.Client{BaseURL: srv.URL + cfg.BasePath, Token: strings.TrimSpace(string(token)),
				HTTP: &http.Client{Transport: headerTransport{xff: "203.0.113.9"}}}
			if err := c.Call(ctx, "sites.create", &apiv1.CreateSiteRequest{Name: "xff", Region: "default"}, &apiv1.Site{}); err != nil {
				t.Fatal(err)
			}
			var audit apiv1.ListAuditResponse
			if err := c.Call(ctx, "audit.list", &apiv1.ListAuditRequest{ActionPrefix: "sites.create"}, &audit); err != nil {
				t.Fatal(err)
			}
			if len(audit.GetEntries()) != 1 || audit.GetEntries()[0].GetSourceIp() != tc.want {
				t.Fatalf("audit of sites.create with X-Forwarded-For 203.0.113.9: %v, want source %s", audit.GetEntries(), tc.want)
			}
		})
	}
}
