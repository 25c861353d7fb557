package doctor

import (
	"cmp"
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/nodestate"
	"github.com/better-compute/better-compute/bcd/session"
)

// Status is a check's outcome.
type Status string

// Statuses, from best to worst.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

func (s Status) rank() int {
	switch s {
	case Warn:
		return 1
	case Fail:
		return 2
	}
	return 0
}

// Check ids.
const (
	IDIdentity    = "identity"
	IDCertificate = "node.certificate"
	IDSession     = "node.session"
	IDJoinToken   = "join-token"
	IDDNS         = "gateway.dns"
	IDTCP         = "gateway.tcp"
	IDTLS         = "gateway.tls"
	IDGatewayTime = "gateway.clock"
	IDClock       = "clock"
	IDNVML        = "nvml"
	IDHelper      = "helper"
	IDPlugins     = "plugins"
	IDPlugin      = "plugin"
)

// DefaultPluginDir is where bcd looks for plugins unless configured
// otherwise (the same as package bcd/plugin's DefaultDir).
const DefaultPluginDir = "/usr/lib/bcd/plugins"

// Result is the outcome of one check.
type Result struct {
	// ID names the check, such as "gateway.tls".
	ID string `json:"id"`
	// Target is what the check looked at when there are several: a gateway
	// URL, a file, a plugin; empty otherwise.
	Target string `json:"target,omitempty"`
	// Status is ok, warn or fail.
	Status Status `json:"status"`
	// Hint is one line for people: what was found and what to do.
	Hint string `json:"hint"`
	// Detail holds the figures behind the status.
	Detail string `json:"detail,omitempty"`
}

func result(id, target string, st Status, hint string, detail ...string) Result {
	return Result{ID: id, Target: target, Status: st, Hint: hint, Detail: strings.Join(detail, "; ")}
}

// Report is the outcome of Run.
type Report struct {
	// Status is the worst status of Checks.
	Status Status `json:"status"`
	// Checks are the results in the order of the package documentation.
	Checks []Result `json:"checks"`
}

func (r *Report) add(res ...Result) {
	for _, x := range res {
		r.Checks = append(r.Checks, x)
		if x.Status.rank() > r.Status.rank() {
			r.Status = x.Status
		}
	}
}

// Count returns how many checks ended with st.
func (r *Report) Count(st Status) int {
	n := 0
	for _, c := range r.Checks {
		if c.Status == st {
			n++
		}
	}
	return n
}

// Failed reports whether doctor should exit non-zero: a failed check, or
// with strict a warning too.
func (r *Report) Failed(strict bool) bool {
	return r.Status == Fail || (strict && r.Status == Warn)
}

// Config configures Run.
type Config struct {
	// DataDir holds the node's identity. Defaults to identity.DefaultDir.
	DataDir string
	// Gateways are gateway URLs to check besides the identity's (before a
	// join, the one to join through). Defaults to none.
	Gateways []string
	// TokenFile, when set, is a join token file to check; before a join its
	// pin is the trust anchor of the TLS check.
	TokenFile string
	// HelperSocket is the root helper's socket. Defaults to
	// helper.DefaultSocket, checked only when the socket exists; a socket
	// named here is always checked.
	HelperSocket string
	// PluginDir is the plugin directory. Defaults to DefaultPluginDir.
	PluginDir string
	// NVML is the NVML library. Defaults to nvml.New().
	NVML nvml.Interface
	// Timeout bounds each network step and each plugin's version call.
	// Defaults to 5 s.
	Timeout time.Duration
	// Resolver resolves gateway hosts. Defaults to net.DefaultResolver.
	Resolver *net.Resolver
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Run runs every check and returns the report; it does not fail.
func Run(ctx context.Context, cfg Config) *Report {
	helperNamed := cfg.HelperSocket != ""
	cfg.DataDir = cmp.Or(cfg.DataDir, identity.DefaultDir)
	cfg.HelperSocket = cmp.Or(cfg.HelperSocket, helper.DefaultSocket)
	cfg.PluginDir = cmp.Or(cfg.PluginDir, DefaultPluginDir)
	cfg.Timeout = cmp.Or(cfg.Timeout, 5*time.Second)
	if cfg.NVML == nil {
		cfg.NVML = nvml.New()
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	now := cfg.Now()
	r := &Report{Status: OK}

	idRes, id := Identity(cfg.DataDir)
	r.add(idRes)
	var trust session.Trust
	gateways := slices.Clone(cfg.Gateways)
	if id != nil {
		var skew time.Duration // as bcd node last measured it
		if st, err := nodestate.Read(cfg.DataDir); err == nil {
			skew = st.Skew()
		}
		r.add(Certificate(id, now, skew))
		r.add(Session(cfg.DataDir, now))
		trust = id.Trust()
		for _, g := range id.Gateways {
			if !slices.Contains(gateways, g) {
				gateways = append(gateways, g)
			}
		}
	}
	if cfg.TokenFile != "" {
		res, pin := JoinToken(cfg.TokenFile, id)
		r.add(res)
		if trust.IsZero() && pin != "" {
			trust.Pin = pin
		}
	}
	for _, g := range gateways {
		r.add(Gateway(ctx, g, trust, cfg)...)
	}
	if len(gateways) == 0 {
		r.add(result(IDDNS, "", Warn, "no gateway to check: join first, or name one with --gateway"))
	}
	r.add(LocalClock())
	r.add(NVML(cfg.NVML))
	r.add(Helper(ctx, cfg.HelperSocket, helperNamed, cfg.Timeout))
	r.add(Plugins(ctx, cfg.PluginDir, cfg.Timeout)...)
	return r
}

// Identity loads the node's identity from dir. Not joined fails: bcd node
// exits 5 without one.
func Identity(dir string) (Result, *identity.Identity) {
	id, err := identity.NewStore(dir).Load()
	switch {
	case errors.Is(err, identity.ErrNotJoined):
		return result(IDIdentity, dir, Fail, "not joined: run bcd join --gateway URL --token-file FILE"), nil
	case err != nil:
		return result(IDIdentity, dir, Fail, "the identity does not load: join again with bcd join --force", err.Error()), nil
	}
	return result(IDIdentity, dir, OK, "node "+id.NodeID+" of trust domain "+id.TrustDomain,
		"pool "+id.PoolID+", site "+id.SiteID+", region "+id.Region, "gateways "+strings.Join(id.Gateways, ", ")), id
}
