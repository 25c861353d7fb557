package bootstrap_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestRenewerRenewsWhileRunning: with an injected clock, a round leaves a
// certificate far from its end alone and re-issues one within 30 days of
// it into the same files with the same key, so that the reloading server
// serves the new one; the next round finds nothing due.
func TestRenewerRenewsWhileRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	const secret = "renewer-test-secret-0123456789abcdef"
	b, err := bootstrap.InitBundle(ctx, st, secret, "renew.test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	names := bootstrap.Names{DNS: []string{"localhost"}}
	certFile, keyFile, issued, err := bootstrap.EnsureServingCert(b, dir, bootstrap.GatewayCertFile, bootstrap.GatewayKeyFile, names)
	if err != nil || !issued {
		t.Fatalf("first issue: %v %v", issued, err)
	}
	first := leaf(t, certFile, keyFile)
	keyBefore, _ := os.ReadFile(keyFile)

	now := time.Now()
	clock := now
	r, err := bootstrap.NewRenewer(bootstrap.RenewerConfig{Store: st, Secret: secret, Dir: dir,
		Certs: []bootstrap.ServingCert{{Use: "gateway", CertName: bootstrap.GatewayCertFile, KeyName: bootstrap.GatewayKeyFile}},
		Names: func() bootstrap.Names { return names }, Now: func() time.Time { return clock },
		Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Round(ctx); err != nil || len(got) != 0 {
		t.Fatalf("round a year from the end issued %v, %v", got, err)
	}
	// 31 days before its end: still kept.
	clock = first.NotAfter.Add(-31 * 24 * time.Hour)
	if got, err := r.Round(ctx); err != nil || len(got) != 0 {
		t.Fatalf("round 31 days from the end issued %v, %v", got, err)
	}
	// 29 days before: re-issued, same key, later end.
	clock = first.NotAfter.Add(-29 * 24 * time.Hour)
	got, err := r.Round(ctx)
	if err != nil || len(got) != 1 || got[0] != certFile {
		t.Fatalf("round 29 days from the end issued %v, %v; want %s", got, err, certFile)
	}
	// The issue itself runs on the real clock (a year from now): what
	// the injected clock moved is only when it is due. So the file holds
	// a new certificate, not an older one.
	second := leaf(t, certFile, keyFile)
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 || second.NotAfter.Before(first.NotAfter) {
		t.Fatalf("renewed certificate %x ends %s; the first was %x ending %s", second.SerialNumber, second.NotAfter, first.SerialNumber, first.NotAfter)
	}
	if keyAfter, _ := os.ReadFile(keyFile); !bytes.Equal(keyBefore, keyAfter) {
		t.Fatal("the key changed on renewal: pins of it would break")
	}
	// Back on the real clock the new certificate is a year from its end.
	clock = now
	if got, err := r.Round(ctx); err != nil || len(got) != 0 {
		t.Fatalf("round after the renewal issued %v, %v", got, err)
	}
	// The renewed certificate's own last month: renewed again, same key.
	clock = second.NotAfter.Add(-29 * 24 * time.Hour)
	if got, err := r.Round(ctx); err != nil || len(got) != 1 {
		t.Fatalf("second renewal issued %v, %v; want %s", got, err, certFile)
	}
	if third := leaf(t, certFile, keyFile); third.SerialNumber.Cmp(second.SerialNumber) == 0 {
		t.Fatal("the second renewal left the first renewal's certificate")
	}
	if keyAfter, _ := os.ReadFile(keyFile); !bytes.Equal(keyBefore, keyAfter) {
		t.Fatal("the key changed on the second renewal")
	}
	if _, err := bootstrap.NewRenewer(bootstrap.RenewerConfig{Dir: dir}); err == nil {
		t.Fatal("a renewer without a store was made")
	}
}

func leaf(t *testing.T, certFile, keyFile string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf
}

// testWriter routes logs through t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
