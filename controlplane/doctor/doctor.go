package doctor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/clockcheck"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Status is a check's outcome.
type Status string

// Statuses, from best to worst.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// rank orders statuses: a higher rank is worse.
func (s Status) rank() int {
	switch s {
	case Warn:
		return 1
	case Fail:
		return 2
	}
	return 0
}

// Check ids, in the order Run reports them.
const (
	IDSchema             = "schema"
	IDClock              = "clock"
	IDPKI                = "pki"
	IDGatewayIdentity    = "host.gateway.identity"
	IDGatewayNotifier    = "host.gateway.notifier"
	IDRoutes             = "host.routes"
	IDQueue              = "workers.queue"
	IDSweeper            = "workers.sweeper"
	IDGatewayHeadroom    = "fleet.gateway-headroom"
	IDHeartbeats         = "fleet.heartbeats"
	IDOldDaemons         = "fleet.old-daemons"
	IDExpiringCerts      = "fleet.expiring-certs"
	IDClockSkew          = "fleet.clock-skew"
	IDDuplicateHostnames = "fleet.duplicate-hostnames"
	defaultGatewayLive   = 30 * time.Second
	defaultHeartbeat     = 10 * time.Second
	defaultCheckTimeout  = 10 * time.Second
)

// Result is the outcome of one check.
type Result struct {
	// ID names the check, such as "workers.sweeper".
	ID string `json:"id"`
	// Status is ok, warn or fail.
	Status Status `json:"status"`
	// Hint is one line for people: what was found and what to do.
	Hint string `json:"hint"`
	// Detail holds the figures behind the status (counts, names, times);
	// empty when there is nothing to add.
	Detail string `json:"detail,omitempty"`
}

func result(id string, st Status, hint string, detail ...string) Result {
	return Result{ID: id, Status: st, Hint: hint, Detail: strings.Join(detail, "; ")}
}

// Report is the outcome of Run.
type Report struct {
	// Status is the worst status of Checks.
	Status Status `json:"status"`
	// Checks are the results in the order of the package documentation.
	Checks []Result `json:"checks"`
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

// Failed reports whether the report should make doctor exit non-zero: any
// failed check, or with strict any warning too.
func (r *Report) Failed(strict bool) bool {
	return r.Status == Fail || (strict && r.Status == Warn)
}

func (r *Report) add(res Result) {
	r.Checks = append(r.Checks, res)
	if res.Status.rank() > r.Status.rank() {
		r.Status = res.Status
	}
}

// Config is what the checks need besides the store.
type Config struct {
	// Secret is the deployment secret the PKI bundle is sealed under.
	Secret string
	// DatabaseURL is the PostgreSQL URL, for the notifier check; empty on
	// SQLite.
	DatabaseURL string
	// NotifyURL is database.notifyURL, where gateways LISTEN; empty for
	// DatabaseURL.
	NotifyURL string
	// NoListen reports that the process runs none of the roles that
	// LISTEN for wake-ups (gateway, api, sinks): host.gateway.notifier has
	// nothing to judge there (a controllers process through PgBouncer
	// needs no notifyURL; issue 41).
	NoListen bool
	// Embedded reports the embedded default (SQLite), whose serve makes the
	// PKI bundle and the gateway certificate on first start.
	Embedded bool
	// DataDir is where the embedded default keeps its gateway certificate
	// (DataDir/pki).
	DataDir string
	// Gateway describes the gateway role of this configuration.
	Gateway GatewayConfig
	// API describes the api role of this configuration (api.tls).
	API APIConfig
	// BasePath prefixes the API routes. Defaults to /api.
	BasePath string
	// Routes are the configured host routes (absolute paths). There are
	// none in the configuration yet.
	Routes []string
	// HeartbeatInterval is the interval gateways tell daemons. Defaults to
	// 10 s.
	HeartbeatInterval time.Duration
	// NodeCertTTL is the life of node certificates
	// (host.gateway.nodeCertTTL): a certificate left with less than a sixth
	// of it, or CertWarnWithin, has missed its renewal. Defaults to 24 h.
	NodeCertTTL time.Duration
	// GatewayLiveWithin is how fresh a gateways row's heartbeat_at must be
	// for the gateway to count as live. Defaults to 30 s (the gateway lease
	// lives 20 s and the row is refreshed every 5 s).
	GatewayLiveWithin time.Duration
	// ProcessStaleAfter is how old a processes row's heartbeat may be
	// before control-plane.processes warns: three
	// host.processes.heartbeatInterval. Defaults to 15 s.
	ProcessStaleAfter time.Duration
	// Now is the local clock. Defaults to time.Now.
	Now func() time.Time
}

// GatewayConfig is the gateway part of Config.
type GatewayConfig struct {
	// Enabled reports whether the configuration runs the gateway role.
	Enabled bool
	// CertFile and KeyFile are host.gateway.tlsFiles; empty for the
	// embedded default's own files.
	CertFile, KeyFile string
	// PublicURL is what daemons dial; its host must be named by the
	// serving certificate.
	PublicURL string
	// Internal is host.gateway.internal.
	Internal InternalConfig
}

// FromConfig builds a Config from the control plane's configuration.
func FromConfig(c *config.Config) Config {
	return Config{
		Secret:      c.Secret,
		DatabaseURL: c.Database.URL,
		NotifyURL:   c.Database.NotifyURL,
		NoListen:    !c.Runs("gateway") && !c.Runs("api") && !c.Runs("sinks"),
		Embedded:    c.Embedded,
		DataDir:     c.DataDir,
		Gateway: GatewayConfig{
			Enabled:   c.Runs("gateway"),
			CertFile:  c.Host.Gateway.TLSFiles.Cert,
			KeyFile:   c.Host.Gateway.TLSFiles.Key,
			PublicURL: c.Host.Gateway.PublicURL,
			Internal: InternalConfig{CertFile: c.Host.Gateway.Internal.TLSFiles.Cert, KeyFile: c.Host.Gateway.Internal.TLSFiles.Key,
				Address: c.Host.Gateway.Internal.Address, SplitRoles: !c.AllRoles(), Roles: c.RolesList},
		},
		API:               apiConfig(c),
		BasePath:          c.BasePath,
		HeartbeatInterval: c.Host.Gateway.HeartbeatInterval.Duration,
		NodeCertTTL:       c.Host.Gateway.NodeCertTTL.Duration,
		ProcessStaleAfter: 3 * c.Host.Processes.HeartbeatInterval.Duration,
	}
}

func (c *Config) defaults() {
	c.BasePath = cmp.Or(c.BasePath, "/api")
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, defaultHeartbeat)
	c.NodeCertTTL = cmp.Or(c.NodeCertTTL, 24*time.Hour)
	c.GatewayLiveWithin = cmp.Or(c.GatewayLiveWithin, defaultGatewayLive)
	c.ProcessStaleAfter = cmp.Or(c.ProcessStaleAfter, 15*time.Second)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Embedded && c.Gateway.CertFile == "" && c.Gateway.KeyFile == "" && c.DataDir != "" {
		dir := filepath.Join(c.DataDir, bootstrap.PKIDir)
		c.Gateway.CertFile = filepath.Join(dir, bootstrap.GatewayCertFile)
		c.Gateway.KeyFile = filepath.Join(dir, bootstrap.GatewayKeyFile)
	}
}

// Run runs every check against st and returns the report. It does not fail:
// a check that cannot run reports fail with the reason.
func Run(ctx context.Context, st store.Store, cfg Config) *Report {
	cfg.defaults()
	r := &Report{Status: OK}
	schema, migrated := Schema(ctx, st)
	r.add(schema)
	clock, now := Clock(ctx, st, cfg.Now)
	if clock.Status != Fail && migrated {
		// Behind the newest certificate issued: a gateway on this clock
		// would refuse the fleet (package clockcheck; serve is not ready).
		if err := clockcheck.Check(ctx, st, cfg.Now()); errors.Is(err, clockcheck.ErrClockWrong) {
			clock = result(IDClock, Fail, err.Error(), clock.Detail)
		}
	}
	r.add(clock)
	if !migrated {
		r.add(Routes(cfg.BasePath, cfg.Routes))
		return r
	}
	pkiRes, bundle := PKI(ctx, st, cfg.Secret, cfg.Embedded, now)
	r.add(pkiRes)
	for _, ca := range CAs(bundle, pkiRes, now) {
		r.add(ca)
	}
	r.add(TokenExpiry(ctx, st, now))
	r.add(GatewayIdentity(bundle, cfg.Gateway, cfg.Embedded, now))
	r.add(APITLS(cfg.API, now))
	if cfg.NoListen {
		r.add(result(IDGatewayNotifier, OK, "this process runs none of the roles that LISTEN (gateway, api, sinks): it hears no wake-ups"))
	} else {
		r.add(Notifier(ctx, st.Dialect(), cfg.DatabaseURL, cfg.NotifyURL))
	}
	r.add(Routes(cfg.BasePath, cfg.Routes))
	queue, overdue := Queue(ctx, st, now)
	r.add(queue)
	r.add(Sweeper(ctx, st, overdue, now))
	r.add(DeadLetters(ctx, st))
	r.add(RemediationBreaker(ctx, st))
	r.add(BtreeGist(ctx, st))
	if ps, err := st.ProcessList(ctx); err != nil {
		r.add(result(IDProcesses, Fail, "cannot list processes: "+err.Error()))
	} else {
		r.add(Processes(ps, now, cfg.ProcessStaleAfter))
	}

	gws, gwErr := st.GatewayList(ctx)
	nodes, nodesErr := listNodes(ctx, st)
	switch {
	case gwErr != nil:
		r.add(result(IDGatewayHeadroom, Fail, "cannot list gateways: "+gwErr.Error()))
	case nodesErr != nil:
		r.add(result(IDGatewayHeadroom, Fail, "cannot list nodes: "+nodesErr.Error()))
	default:
		r.add(GatewayHeadroom(gws, len(nodes), now, cfg.GatewayLiveWithin))
	}
	r.add(Internal(bundle, cfg.Gateway.Internal, gws, now, cfg.GatewayLiveWithin))
	r.add(Tunnels(cfg.Gateway.Internal))
	if nodesErr != nil {
		for _, id := range []string{IDHeartbeats, IDOldDaemons, IDExpiringCerts, IDClockSkew} {
			r.add(result(id, Fail, "cannot list nodes: "+nodesErr.Error()))
		}
	} else {
		r.add(Heartbeats(nodes, cfg.HeartbeatInterval, now))
		r.add(OldDaemons(nodes))
		r.add(ExpiringCerts(nodes, now, min(CertWarnWithin, cfg.NodeCertTTL/6)))
		r.add(ClockSkew(nodes))
	}
	r.add(DuplicateHostnames(ctx, st))
	return r
}

// listNodes pages through every node.
func listNodes(ctx context.Context, st interface {
	NodeList(context.Context, *store.NodeListParams) ([]*store.Node, error)
}) ([]*store.Node, error) {
	var all []*store.Node
	p := &store.NodeListParams{ListParams: store.ListParams{Limit: store.MaxListLimit}}
	for {
		page, err := st.NodeList(ctx, p)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < store.MaxListLimit {
			return all, nil
		}
		p.Cursor = page[len(page)-1].ID
	}
}

// some names up to five ids, then how many more.
func some(ids []string) string {
	if len(ids) <= 5 {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:5], ", "), len(ids)-5)
}

// short formats a duration without zero minutes and seconds: "6h", "2m",
// "30s".
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// days formats a duration as rounded days, or hours below two days.
func days(d time.Duration) string {
	if d < 48*time.Hour {
		return fmt.Sprintf("%.0f h", d.Hours())
	}
	return fmt.Sprintf("%.0f days", d.Hours()/24)
}
