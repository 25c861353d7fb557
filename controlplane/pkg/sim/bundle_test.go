package sim

import (
	"context"
	"crypto/x509"
	"testing"
)

// TestHoldBundle: a held daemon keeps no bundle until ReleaseBundle, and
// its session's end ends the wait with an error (no ack).
func TestHoldBundle(t *testing.T) {
	t.Parallel()
	d, err := NewFakeDaemon(DaemonConfig{Name: "bundle-01"})
	if err != nil {
		t.Fatal(err)
	}
	root := &x509.Certificate{IsCA: true}
	if err := d.keepBundle(context.Background(), []*x509.Certificate{root}); err != nil {
		t.Fatal(err)
	}
	if roots, at, kept := d.Bundle(); len(roots) != 1 || at.IsZero() || kept != 1 {
		t.Fatalf("Bundle() = %d roots, %v, %d; want 1, a time, 1", len(roots), at, kept)
	}

	d.HoldBundle()
	d.HoldBundle()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.keepBundle(ended, nil); err == nil {
		t.Fatal("keepBundle while held, session ended: nil error, want one")
	}
	done := make(chan error, 1)
	go func() { done <- d.keepBundle(context.Background(), []*x509.Certificate{root, root}) }()
	select {
	case err := <-done:
		t.Fatalf("keepBundle returned %v while held", err)
	default:
	}
	d.ReleaseBundle()
	d.ReleaseBundle()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if roots, _, kept := d.Bundle(); len(roots) != 2 || kept != 2 {
		t.Fatalf("after release: %d roots, %d kept; want 2, 2", len(roots), kept)
	}
}
