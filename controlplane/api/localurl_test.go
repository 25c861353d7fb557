package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// The URL serve records for the CLI beside it: a wildcard listener is
// dialled on 127.0.0.1 (Go reports 0.0.0.0 as [::], and ::1 is missing
// where IPv6 is off), ::1 only for an IPv6 wildcard.
func TestLocalURL(t *testing.T) {
	for listen, want := range map[string]string{"0.0.0.0:0": "http://127.0.0.1:", "127.0.0.1:0": "http://127.0.0.1:", "[::]:0": "http://[::1]:"} {
		srv := api.New(api.Config{Listen: listen, Secret: strings.Repeat("s", 32)}, sqlitetest.Open(t), nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Run(ctx) }()
		select {
		case <-srv.Ready():
		case err := <-done:
			cancel()
			if listen == "[::]:0" {
				t.Logf("no IPv6 here: %v", err)
				continue
			}
			t.Fatalf("listen %s: %v", listen, err)
		}
		if got := srv.LocalURL(); !strings.HasPrefix(got, want) {
			t.Errorf("listen %s: LocalURL %s, want %s…", listen, got, want)
		}
		cancel()
		<-done
	}
}
