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
	first := d.Bundle()
	if len(first.Roots) != 1 || first.First.IsZero() || first.Last != first.First || first.Kept != 1 {
		t.Fatalf("Bundle() = %+v; want 1 root, kept once", first)
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
	if r := d.Bundle(); len(r.Roots) != 2 || r.Kept != 2 || r.First != first.First || r.Last.Before(r.First) {
		t.Fatalf("after release: %+v; want 2 roots, kept twice, first unchanged", r)
	}
}
