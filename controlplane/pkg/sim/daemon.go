package sim

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Version is the bcd version FakeDaemons report.
const Version = "0.0.0-sim"

// ErrNotJoined reports Run on a FakeDaemon that has not joined.
var ErrNotJoined = errors.New("fake daemon not joined")

// DaemonConfig configures a FakeDaemon.
type DaemonConfig struct {
	// Name is the simulated hostname; machine id, serials and GPU UUIDs
	// derive from it. Required.
	Name string
	// Labels are sent in the join facts. Defaults to none.
	Labels map[string]string
	// Trust overrides how gateways are authenticated. Defaults to the pin
	// of the join token.
	Trust session.Trust
	// Session holds the client settings to use (backoff, timeouts, buffer
	// sizes, OnEvent, Logger, Clock; Keepalive defaults to off here, as
	// heartbeats keep the connection busy); the fields that come from the
	// daemon's identity and simulated host (Gateways, Trust, Key, Chain,
	// RenewAfter, Identity, BCDVersion, OS, Arch, BootID, Reporter) are set
	// by the FakeDaemon.
	Session session.Config
	// NoInventory skips sending the simulated Inventory after the first
	// Welcome (its digest is still reported).
	NoInventory bool
	// Logger receives the daemon's logs. Defaults to Session.Logger, else
	// discarding them.
	Logger *slog.Logger
	// StateDir, when set, keeps the daemon's key and identity there, in
	// bcd's data directory layout (bcd/identity.Store), so that a daemon
	// made again with the same StateDir is the same node: NewFakeDaemon
	// restores them unless the certificate has expired, and Join then
	// only points the daemon at the gateway it is given; a fresh Join saves
	// them. Renewals are not saved. Defaults to none: a fresh key each time.
	StateDir string
}

// FakeDaemon is one simulated bcd. Join it once, then Run it.
type FakeDaemon struct {
	cfg    DaemonConfig
	log    *slog.Logger
	key    *ecdsa.PrivateKey
	bootID string
	inv    *sessionv1.Inventory

	mu sync.Mutex
	id *session.JoinResult
	// restored: id and key came from StateDir, and Join does not join.
	restored bool
	// known is the gateway list Welcomes gave (session.MergeGateways).
	known []session.KnownGateway
	cur   *session.Client

	// rel plays the releases the daemon is upgraded to (release.go).
	rel releaseState
	// flt holds the injected faults (faults.go).
	flt faultState
	// bnd holds the node CA bundles kept (bundle.go).
	bnd bundleState
}

// NewFakeDaemon returns a FakeDaemon with a fresh P-256 key and a simulated
// host named cfg.Name.
func NewFakeDaemon(cfg DaemonConfig) (*FakeDaemon, error) {
	if cfg.Name == "" {
		return nil, errors.New("new fake daemon: no name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new fake daemon: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = cfg.Session.Logger
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var boot [16]byte
	_, _ = rand.Read(boot[:])
	d := &FakeDaemon{
		cfg:    cfg,
		log:    log.With("sim_daemon", cfg.Name),
		key:    key,
		bootID: uuid(boot[:]),
		inv:    simulatedInventory(cfg.Name),
	}
	if err := d.restore(time.Now()); err != nil {
		return nil, fmt.Errorf("new fake daemon %s: %w", cfg.Name, err)
	}
	return d, nil
}

// Name returns the simulated hostname.
func (d *FakeDaemon) Name() string { return d.cfg.Name }

// NodeID returns the id the control plane gave the daemon; "" before Join.
func (d *FakeDaemon) NodeID() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.id == nil {
		return ""
	}
	return d.id.NodeID
}

// Identity returns what Join obtained, with renewals applied; nil before
// Join.
func (d *FakeDaemon) Identity() *session.JoinResult {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.id == nil {
		return nil
	}
	c := *d.id
	return &c
}

// Key returns the daemon's private key (P-256): the key of its CSRs and of
// the client certificate it presents, for a driver that makes the node's
// own calls (the renewal benchmark, tests/bench/fleet).
func (d *FakeDaemon) Key() crypto.Signer { return d.key }

// Inventory returns the simulated inventory.
func (d *FakeDaemon) Inventory() *sessionv1.Inventory { return d.inv }

// Facts returns the join facts of the simulated host.
func (d *FakeDaemon) Facts() *sessionv1.NodeFacts {
	h := d.inv.GetHost()
	return &sessionv1.NodeFacts{
		Hostname:   h.GetHostname(),
		MachineId:  h.GetMachineId(),
		Os:         "linux",
		Arch:       "amd64",
		BcdVersion: Version,
		BootId:     d.bootID,
		Labels:     maps.Clone(d.cfg.Labels),
	}
}

// Join joins through gatewayURL with token (session.Join) and keeps the
// identity in memory. The daemon's clock is Session.Clock when set, as for
// Run, so that a simulated machine whose clock is wrong joins by it too.
func (d *FakeDaemon) Join(ctx context.Context, gatewayURL, token string) error {
	d.mu.Lock()
	restored := d.restored
	if restored {
		// The node's identity was kept (StateDir): the same node, through
		// this gateway, as a restarted bcd.
		c := *d.id
		c.Gateways = []string{gatewayURL}
		d.id = &c
	}
	d.mu.Unlock()
	if restored {
		return nil
	}
	var now func() time.Time
	if c := d.cfg.Session.Clock; c != nil {
		now = c.Now
	}
	res, err := session.Join(ctx, session.JoinParams{
		GatewayURL: gatewayURL,
		Token:      token,
		Key:        d.key,
		Facts:      d.Facts(),
		Trust:      d.cfg.Trust,
		UserAgent:  "bcd-sim/" + Version,
		Now:        now,
		Logger:     d.log,
	})
	if err != nil {
		return fmt.Errorf("fake daemon %s: %w", d.cfg.Name, err)
	}
	d.mu.Lock()
	d.id = res
	d.mu.Unlock()
	d.log.DebugContext(ctx, "Joined", logkey.NodeID, res.NodeID)
	return d.keep(res)
}

// knownGateways returns the gateway list the daemon's Welcomes gave.
func (d *FakeDaemon) knownGateways() []session.KnownGateway {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.known
}

// Send sends msg on the daemon's session (session.Client.Send).
func (d *FakeDaemon) Send(msg *sessionv1.NodeMessage) error {
	d.mu.Lock()
	c := d.cur
	d.mu.Unlock()
	if c == nil {
		return session.ErrNotConnected
	}
	return c.Send(msg)
}

// runSession holds one session of the daemon until ctx ends, as
// session.Client.Run does (nil when ctx ends, ErrRevoked,
// ErrCertificateExpired); Run (release.go) starts it again after a
// simulated restart. It fails with ErrNotJoined before Join.
func (d *FakeDaemon) runSession(ctx context.Context) error {
	d.mu.Lock()
	id := d.id
	d.mu.Unlock()
	if id == nil {
		return fmt.Errorf("fake daemon %s: %w", d.cfg.Name, ErrNotJoined)
	}
	cfg := d.cfg.Session
	cfg.Gateways = id.Gateways
	cfg.Trust = id.Trust
	cfg.Key = d.key
	cfg.Chain = id.Chain
	cfg.RenewAfter = id.RenewAfter
	cfg.ReattestGrace = id.ReattestGrace
	cfg.KnownGateways = d.knownGateways()
	cfg.Identity = daemonIdentity{d}
	if cfg.Keepalive == 0 {
		// Heartbeats keep the connection busy; gRPC's keepalive would add
		// a goroutine per daemon and only matters for real networks.
		cfg.Keepalive = -1
	}
	cfg.BCDVersion = d.Version()
	cfg.OS, cfg.Arch = "linux", "amd64"
	cfg.BootID = d.currentBootID()
	cfg.Reporter = daemonReporter{d: d, ctx: ctx}
	if cfg.Handler == nil {
		cfg.Handler = d.commands()
	}
	if cfg.Logger == nil {
		cfg.Logger = d.log
	}
	next := cfg.OnEvent
	cfg.OnEvent = func(ev session.Event) {
		if ev.Kind == session.EventConnected {
			// The inventory with the GPUs' injected health (faults.go):
			// after the first Welcome, and after a later one when it
			// changed since it was sent.
			d.sendInventoryIfDue()
		}
		if next != nil {
			next(ev)
		}
	}
	// One session, or more after simulated outages (faults.go).
	return d.runClients(ctx, cfg)
}

// daemonIdentity is a FakeDaemon's session.IdentityKeeper: it keeps the
// renewed certificate and the gateway list in memory, for the daemon's
// next session.
type daemonIdentity struct{ d *FakeDaemon }

func (k daemonIdentity) KeepRenewal(_ context.Context, r *session.Renewal) error {
	d := k.d
	d.mu.Lock()
	defer d.mu.Unlock()
	c := *d.id
	c.Chain, c.RenewAfter, c.ReattestGrace = r.Chain, r.RenewAfter, r.ReattestGrace
	if len(r.NodeCARoots) > 0 {
		c.NodeCARoots = r.NodeCARoots
	}
	d.id = &c
	return nil
}

func (k daemonIdentity) KeepGateways(_ context.Context, known []session.KnownGateway) error {
	k.d.mu.Lock()
	k.d.known = known
	k.d.mu.Unlock()
	return nil
}

// KeepBundle keeps the roots in memory (FakeDaemon.Bundle), after waiting
// while the daemon holds bundles (HoldBundle). The daemon's next session
// still trusts gateways by the join token's pin, not by these roots.
func (k daemonIdentity) KeepBundle(ctx context.Context, roots []*x509.Certificate) error {
	return k.d.keepBundle(ctx, roots)
}

// KeepGatewayRoots keeps a gateway-CA rotation's roots in memory
// (FakeDaemon.Bundle, GatewayRoots), after waiting while the daemon holds
// bundles (HoldBundle), as KeepBundle does: a FakeDaemon takes part in
// gateway-CA rotations (capability "gateway.bundle"). The session trusts
// them from then on; a new session of the daemon trusts the join token's
// pins only.
func (k daemonIdentity) KeepGatewayRoots(ctx context.Context, roots []*x509.Certificate) error {
	return k.d.keepGatewayRoots(ctx, roots)
}

// daemonReporter is a FakeDaemon's session.Reporter: its simulated
// inventory's digest and readings; while the daemon hangs, FillHeartbeat
// blocks (heartbeatIn) until the hang or ctx (the session's) ends.
type daemonReporter struct {
	d   *FakeDaemon
	ctx context.Context
}

func (r daemonReporter) InventoryDigest() string                  { return r.d.inventoryDigest() }
func (r daemonReporter) FillHeartbeat(hb *sessionv1.Heartbeat)    { r.d.heartbeatIn(r.ctx, hb) }
func (daemonReporter) PendingResults() []*sessionv1.CommandResult { return nil }
func (daemonReporter) LocalRollback() *sessionv1.LocalRollback    { return nil }

// heartbeat fills simulated readings: a steady light load.
func (d *FakeDaemon) heartbeat(hb *sessionv1.Heartbeat) {
	hb.Load1, hb.Load5, hb.Load15 = 0.42, 0.40, 0.38
	hb.UptimeSeconds = d.inv.GetHost().GetUptimeSeconds()
	hb.MemoryAvailableBytes = d.inv.GetHost().GetMemory().GetAvailableBytes()
}

// uuid formats 16 bytes as a version 4 UUID.
func uuid(b []byte) string {
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// derive returns n bytes derived from name and purpose, stable across runs.
func derive(name, purpose string, n int) []byte {
	sum := sha256.Sum256([]byte(purpose + "\x00" + name))
	return sum[:n]
}
