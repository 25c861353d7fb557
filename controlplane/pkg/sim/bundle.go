package sim

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Node CA bundles (DESIGN.md, "CA rotation"; docs/pki.md, "Rotating the
// node CA"): while a rotation propagates, every session carries a Bundle
// with the node CA roots, and bcd stores them before it acknowledges them
// (BundleAck). A FakeDaemon keeps them in memory, with the moment it did,
// and can be told to hold them (HoldBundle): its KeepBundle then waits,
// so the daemon does not acknowledge until ReleaseBundle, as a bcd whose
// disk stalls. That makes a node that has not acknowledged, for a test or
// benchmark that checks what a rotation's status lists as missing or
// that it activates at its threshold and not before.

// bundleState is what a FakeDaemon did with the Bundles its sessions
// carried.
type bundleState struct {
	mu  sync.Mutex
	rec BundleRecord
	// held is closed while bundles are kept at once; an open channel
	// while HoldBundle holds them.
	held chan struct{}
}

// heldLocked returns the channel KeepBundle waits on; b.mu must be held.
func (b *bundleState) heldLocked() chan struct{} {
	if b.held == nil {
		b.held = closedChan()
	}
	return b.held
}

// HoldBundle makes the daemon hold the Bundles its sessions carry from now
// on: KeepBundle waits, and with it the session's reading of later
// messages (commands included), until ReleaseBundle or the session's end,
// so the daemon does not acknowledge them. Holding twice is holding once.
func (d *FakeDaemon) HoldBundle() {
	b := &d.bnd
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.heldLocked():
		b.held = make(chan struct{})
	default:
	}
}

// ReleaseBundle ends HoldBundle: a Bundle held is kept and acknowledged at
// once, and later ones as they come.
func (d *FakeDaemon) ReleaseBundle() {
	b := &d.bnd
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.heldLocked():
	default:
		close(b.held)
	}
}

// BundleRecord is what a FakeDaemon kept of the Bundles its sessions
// carried; each one kept is acknowledged, unless the session ended first.
type BundleRecord struct {
	// Roots are the node CA roots of the latest Bundle kept.
	Roots []*x509.Certificate
	// First and Last are when the first and the latest were kept: a
	// gateway sends the bundle again at each phase change of a rotation
	// and on each new session, so First is the acknowledgement of a
	// rotation's start when the daemon kept none before it.
	First, Last time.Time
	// Kept counts the Bundles kept.
	Kept int
	// GatewayRoots are the gateway CA roots of the latest gateway-CA
	// rotation's Bundle kept; GatewayKept counts those Bundles.
	GatewayRoots []*x509.Certificate
	GatewayKept  int
}

// Bundle returns what the daemon kept of the Bundles its sessions
// carried; the zero BundleRecord before any.
func (d *FakeDaemon) Bundle() BundleRecord {
	b := &d.bnd
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.rec
	r.Roots, r.GatewayRoots = slices.Clone(r.Roots), slices.Clone(r.GatewayRoots)
	return r
}

// waitUnheld returns once the daemon holds no bundles (HoldBundle), or
// ctx's error, wrapped with what, when it ends first.
func (d *FakeDaemon) waitUnheld(ctx context.Context, what string) error {
	b := &d.bnd
	b.mu.Lock()
	held := b.heldLocked()
	b.mu.Unlock()
	select {
	case <-held:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fake daemon %s: %s: %w", d.cfg.Name, what, ctx.Err())
	}
}

// keepGatewayRoots waits while the daemon holds bundles (HoldBundle),
// then keeps a gateway-CA rotation's roots in memory.
func (d *FakeDaemon) keepGatewayRoots(ctx context.Context, roots []*x509.Certificate) error {
	if err := d.waitUnheld(ctx, "keep gateway roots"); err != nil {
		return err
	}
	b := &d.bnd
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rec.GatewayRoots = slices.Clone(roots)
	b.rec.GatewayKept++
	return nil
}

// keepBundle waits while the daemon holds bundles (HoldBundle), then keeps
// roots in memory. It fails only when ctx (the session's) ends first.
func (d *FakeDaemon) keepBundle(ctx context.Context, roots []*x509.Certificate) error {
	if err := d.waitUnheld(ctx, "keep bundle"); err != nil {
		return err
	}
	b := &d.bnd
	now := time.Now
	if c := d.cfg.Session.Clock; c != nil {
		now = c.Now
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	at := now()
	if b.rec.Kept == 0 {
		b.rec.First = at
	}
	b.rec.Roots, b.rec.Last = slices.Clone(roots), at
	b.rec.Kept++
	return nil
}
