package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/gpucount"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// Limits of commands.create.
const (
	DefaultCommandTimeout = 10 * time.Minute
	MaxCommandTimeout     = 24 * time.Hour
	DefaultOutputLimit    = 1 << 20
	MaxOutputLimit        = 64 << 20
	MaxTargets            = 10000
)

// MaxAPITokenTTL bounds an API token's life (about two years); tokens
// without a ttl do not expire.
const MaxAPITokenTTL = 2 * 365 * 24 * time.Hour

// joinTokenTTL is a request's join token life: apiv1.DefaultJoinTokenTTL when
// unset, else apiv1.MinJoinTokenTTL to apiv1.MaxJoinTokenTTL (INVALID_ARGUMENT outside).
func joinTokenTTL(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return apiv1.DefaultJoinTokenTTL, nil
	}
	if err := d.CheckValid(); err != nil || d.AsDuration() < apiv1.MinJoinTokenTTL || d.AsDuration() > apiv1.MaxJoinTokenTTL {
		return 0, invalid("ttl", "must be %v to %v", apiv1.MinJoinTokenTTL, apiv1.MaxJoinTokenTTL)
	}
	return d.AsDuration(), nil
}

// registerMethods registers the handler of every API method; which
// methods exist, their roles and which are audited is api.proto's (service
// rpcs with the access option), read here through apiv1.Methods.
func (s *Server) registerMethods() {
	handle(s, "policies.apply", s.policiesApply)
	handle(s, "policies.get", s.policiesGet)
	handle(s, "policies.list", s.policiesList)
	handle(s, "policies.test", s.policiesTest)
	handle(s, "access.request", s.accessRequest)
	handle(s, "access.list", s.accessList)
	handle(s, "access.approve", s.accessApprove)
	handle(s, "access.deny", s.accessDeny)
	handle(s, "access.revoke", s.accessRevoke)
	handle(s, "tenants.create", s.tenantsCreate)
	handle(s, "tenants.list", s.tenantsList)
	handle(s, "tenants.get", s.tenantsGet)
	handle(s, "tenants.suspend", s.tenantsSuspend(true))
	handle(s, "tenants.resume", s.tenantsSuspend(false))
	handle(s, "tenants.delete", s.tenantsDelete)
	handle(s, "sites.create", s.sitesCreate)
	handle(s, "sites.list", s.sitesList)
	handle(s, "pools.create", s.poolsCreate)
	handle(s, "pools.list", s.poolsList)
	handle(s, "pools.get", s.poolsGet)
	handle(s, "pools.setBudget", s.poolsSetBudget)
	handle(s, "pools.move", s.poolsMove)
	handle(s, "joinTokens.create", s.joinTokensCreate)
	handle(s, "joinTokens.list", s.joinTokensList)
	handle(s, "joinTokens.revoke", s.joinTokensRevoke)
	handle(s, "nodes.list", s.nodesList)
	handle(s, "nodes.get", s.nodesGet)
	handle(s, "nodes.cordon", s.nodesCordon(true))
	handle(s, "nodes.uncordon", s.nodesCordon(false))
	handle(s, "nodes.drain", s.nodesDrain)
	handle(s, "nodes.gpuReset", s.nodesGPUReset)
	handle(s, "nodes.reboot", s.nodesReboot)
	handle(s, "nodes.delete", s.nodesDelete)
	handle(s, "nodes.reinstall", s.nodesReinstall)
	handle(s, "nodes.add", s.nodesAdd)
	handle(s, "nodes.setGPUCount", s.nodesSetGPUCount)
	handle(s, "nodes.move", s.nodesMove)
	handle(s, "commands.create", s.commandsCreate)
	handle(s, "commands.get", s.commandsGet)
	handle(s, "commands.list", s.commandsList)
	handle(s, "commands.cancel", s.commandsCancel)
	handle(s, "gateways.list", s.gatewaysList)
	handle(s, "gateways.drain", s.gatewaysDrain(true))
	handle(s, "gateways.undrain", s.gatewaysDrain(false))
	handle(s, "processes.list", s.processesList)
	handle(s, "pki.revoke", s.pkiRevoke)
	handle(s, "pki.rotationStart", s.pkiRotationStart)
	handle(s, "pki.rotationStatus", s.pkiRotationStatus)
	handle(s, "pki.rotationAdvance", s.pkiRotationAdvance)
	handle(s, "pki.rotationRollback", s.pkiRotationRollback)
	handle(s, "release.pinsAdd", s.releasePinsAdd)
	handle(s, "release.pinsStatus", s.releasePinsStatus)
	handle(s, "release.pinsRemove", s.releasePinsRemove)
	handle(s, "tunnels.create", s.tunnelsCreate)
	handle(s, "recordings.list", s.recordingsList)
	handle(s, "recordings.get", s.recordingsGet)
	handle(s, "fleet.summary", s.fleetSummary)
	handle(s, "tokens.create", s.tokensCreate)
	handle(s, "tokens.list", s.tokensList)
	handle(s, "tokens.revoke", s.tokensRevoke)
	handle(s, "bmc.setCredentials", s.bmcSetCredentials)
	handle(s, "bmc.deleteCredentials", s.bmcDeleteCredentials)
	handle(s, "audit.list", s.auditList)
	handle(s, "events.list", s.eventsList)
	handle(s, "sinks.deadLetters", s.sinksDeadLetters)
	handle(s, "sinks.replay", s.sinksReplay)
	handle(s, "rollouts.create", s.rolloutsCreate)
	handle(s, "rollouts.list", s.rolloutsList)
	handle(s, "rollouts.get", s.rolloutsGet)
	handle(s, "rollouts.pause", s.rolloutsAction("pause", store.RolloutPaused, store.RolloutRunning))
	handle(s, "rollouts.resume", s.rolloutsAction("resume", store.RolloutRunning, store.RolloutPaused))
	handle(s, "rollouts.abort", s.rolloutsAction("abort", store.RolloutAborted, store.RolloutPending, store.RolloutRunning,
		store.RolloutPaused, store.RolloutRollingBack, store.RolloutHalted))
	handle(s, "reservations.create", s.reservationsCreate)
	handle(s, "reservations.list", s.reservationsList)
	handle(s, "reservations.get", s.reservationsGet)
	handle(s, "reservations.cancel", s.reservationsCancel)
	handle(s, "reservations.extend", s.reservationsExtend)
	handle(s, "capacity.summary", s.capacitySummary)
	handle(s, "remediation.list", s.remediationList)
	handle(s, "remediation.get", s.remediationGet)
	handle(s, "remediation.pause", s.remediationPause(true))
	handle(s, "remediation.resume", s.remediationPause(false))
	handle(s, "remediation.return", s.remediationReturn)
	handle(s, "remediation.resetBreaker", s.remediationResetBreaker)
	handle(s, "remediation.breakers", s.remediationBreakers)
	handle(s, "remediation.history", s.remediationHistory)
	handle(s, "remediation.stats", s.remediationStats)
	handle(s, "gpus.list", s.gpusList)
	handle(s, "gpus.get", s.gpusGet)
}

// page validates a page request.
func page(p *apiv1.Page) (store.ListParams, error) {
	if p.GetLimit() < 0 || p.GetLimit() > store.MaxListLimit {
		return store.ListParams{}, invalid("page.limit", "must be 0 to %d", store.MaxListLimit)
	}
	if len(p.GetCursor()) > 128 {
		return store.ListParams{}, invalid("page.cursor", "is not a cursor this API returned")
	}
	return store.ListParams{Cursor: p.GetCursor(), Limit: int(p.GetLimit())}, nil
}

// next is the cursor of the following page, empty after the last.
func next[T any](items []*T, lp store.ListParams, id func(*T) string) string {
	limit := lp.Limit
	if limit == 0 {
		limit = 100
	}
	if len(items) < limit || len(items) == 0 {
		return ""
	}
	return id(items[len(items)-1])
}

// name checks a resource name: 1 to 63 of a-z, 0-9, '-', '_', '.'
// (apiv1.CheckName).
func name(field, v string) error {
	if err := apiv1.CheckName(v); err != nil {
		return invalid(field, "%v", err)
	}
	return nil
}

// id checks an identifier argument.
func id(field, v string) error {
	if v == "" {
		return invalid(field, "is required")
	}
	if len(v) > 128 || strings.ContainsAny(v, " \t\r\n/\\") {
		return invalid(field, "is not a valid id")
	}
	return nil
}

func (s *Server) sitesCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreateSiteRequest) (*apiv1.Site, error) {
	if err := name("name", r.GetName()); err != nil {
		return nil, err
	}
	if err := name("region", r.GetRegion()); err != nil {
		return nil, err
	}
	tenant, err := s.tenant(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	site, err := s.store.SiteCreate(ctx, &store.SiteCreateParams{Name: r.GetName(), Region: r.GetRegion(), TenantID: tenant.ID})
	if errors.Is(err, store.ErrConflict) {
		return nil, &Error{Code: apiv1.CodeConflict, Field: "name", Message: "a site named " + r.GetName() + " exists"}
	}
	if err != nil {
		return nil, err
	}
	return siteOut(site), nil
}

func (s *Server) sitesList(ctx context.Context, p *iam.Principal, r *apiv1.ListSitesRequest) (*apiv1.ListSitesResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	lp.Within = within(p)
	sites, err := s.store.SiteList(ctx, &lp)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListSitesResponse{NextCursor: next(sites, lp, func(x *store.Site) string { return x.ID })}
	for _, x := range sites {
		out.Sites = append(out.Sites, siteOut(x))
	}
	return out, nil
}

func (s *Server) poolsCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreatePoolRequest) (*apiv1.Pool, error) {
	if err := name("name", r.GetName()); err != nil {
		return nil, err
	}
	if err := id("site", r.GetSite()); err != nil {
		return nil, err
	}
	site, err := s.store.SiteGet(ctx, r.GetSite())
	if err == nil {
		var ok bool
		if ok, err = s.sees(ctx, p, site.TenantID); err == nil && !ok {
			err = store.ErrNotFound
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "site", Message: "no site " + r.GetSite()}
	}
	if err != nil {
		return nil, err
	}
	tenantID := site.TenantID
	if r.GetTenant() != "" {
		t, err := s.tenant(ctx, p, "tenant", r.GetTenant())
		if err != nil {
			return nil, err
		}
		tenantID = t.ID
	}
	pool, err := s.store.PoolCreate(ctx, &store.PoolCreateParams{Name: r.GetName(), SiteID: site.ID, TenantID: tenantID})
	if errors.Is(err, store.ErrConflict) {
		return nil, &Error{Code: apiv1.CodeConflict, Field: "name", Message: "a pool named " + r.GetName() + " exists"}
	}
	if err != nil {
		return nil, err
	}
	return poolOut(pool), nil
}

func (s *Server) poolsList(ctx context.Context, p *iam.Principal, r *apiv1.ListPoolsRequest) (*apiv1.ListPoolsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	lp.Within = within(p)
	pools, err := s.store.PoolList(ctx, &lp)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListPoolsResponse{NextCursor: next(pools, lp, func(x *store.Pool) string { return x.ID })}
	for _, x := range pools {
		out.Pools = append(out.Pools, poolOut(x))
	}
	return out, nil
}

// poolsGet is the pool with its disruption budget's counts.
func (s *Server) poolsGet(ctx context.Context, p *iam.Principal, r *apiv1.PoolRequest) (*apiv1.Pool, error) {
	pool, err := s.pool(ctx, p, "pool", r.GetPool())
	if err != nil {
		return nil, err
	}
	return s.poolWithBudget(ctx, pool)
}

// poolsSetBudget sets a pool's disruption budget and remediation
// concurrency (docs/disruption-budget.md).
func (s *Server) poolsSetBudget(ctx context.Context, p *iam.Principal, r *apiv1.SetPoolBudgetRequest) (*apiv1.Pool, error) {
	pool, err := s.pool(ctx, p, "pool", r.GetPool())
	if err != nil {
		return nil, err
	}
	if r.GetDisruptionBudget() == "" && r.GetRemediationConcurrency() == 0 {
		return nil, &Error{Code: apiv1.CodeInvalidArgument, Field: "disruptionBudget", Message: "set disruptionBudget, remediationConcurrency or both"}
	}
	if b := r.GetDisruptionBudget(); b != "" {
		if _, err := store.ParseBudget(b); err != nil {
			return nil, &Error{Code: apiv1.CodeInvalidArgument, Field: "disruptionBudget", Message: err.Error()}
		}
	}
	if c := r.GetRemediationConcurrency(); c < 0 || c > 1000 {
		return nil, &Error{Code: apiv1.CodeInvalidArgument, Field: "remediationConcurrency", Message: "want 1 to 1000"}
	}
	err = s.store.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: pool.ID, Spec: r.GetDisruptionBudget(),
		RemediationConcurrency: int(r.GetRemediationConcurrency())})
	if err != nil {
		return nil, err
	}
	if pool, err = s.store.PoolGet(ctx, pool.ID); err != nil {
		return nil, err
	}
	return s.poolWithBudget(ctx, pool)
}

func (s *Server) poolWithBudget(ctx context.Context, pool *store.Pool) (*apiv1.Pool, error) {
	b, err := s.store.PoolBudget(ctx, pool.ID)
	if err != nil {
		return nil, err
	}
	out := poolOut(pool)
	out.Budget = &apiv1.PoolBudget{Nodes: int32(b.Nodes), Budget: int32(b.Budget), OutOfService: int32(b.OutOfService),
		Remediating: int32(b.Remediating)}
	return out, nil
}

// pool resolves a pool id or name for field within the caller's subtree
// (a pool of another tenant is NOT_FOUND, docs/tenants.md).
func (s *Server) pool(ctx context.Context, caller *iam.Principal, field, v string) (*store.Pool, error) {
	if err := id(field, v); err != nil {
		return nil, err
	}
	p, err := s.store.PoolGet(ctx, v)
	if err == nil {
		var ok bool
		if ok, err = s.sees(ctx, caller, p.TenantID); err == nil && !ok {
			err = store.ErrNotFound
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: apiv1.CodeNotFound, Field: field, Message: "no pool " + v}
	}
	return p, err
}

func (s *Server) joinTokensCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreateJoinTokenRequest) (*apiv1.CreateJoinTokenResponse, error) {
	pool, err := s.pool(ctx, p, "pool", r.GetPool())
	if err != nil {
		return nil, err
	}
	ttl, err := joinTokenTTL(r.GetTtl())
	if err != nil {
		return nil, err
	}
	uses := int(r.GetMaxUses())
	if uses == 0 {
		uses = 1
	}
	if uses < 1 || uses > apiv1.MaxJoinTokenUses {
		return nil, invalid("maxUses", "must be 1 to %d", apiv1.MaxJoinTokenUses)
	}
	if len(r.GetDescription()) > 256 {
		return nil, invalid("description", "at most 256 characters")
	}
	pins, err := s.gatewayPins(ctx)
	if err != nil {
		return nil, err
	}
	secret, rec, err := CreateJoinTokenPins(ctx, s.store, pins, pool.ID, ttl, uses, r.GetDescription(), "")
	if err != nil {
		return nil, err
	}
	return &apiv1.CreateJoinTokenResponse{JoinToken: joinTokenOut(rec), Token: secret}, nil
}

// CreateJoinToken mints a join token carrying pin for pool and stores its
// hash. A nodeID that is not empty binds the token to that existing node
// (nodes reinstall): the machine that joins with it becomes that node. It
// returns the token string, shown once, and its record.
func CreateJoinToken(ctx context.Context, st interface {
	JoinTokenCreate(context.Context, *store.JoinTokenCreateParams) (*store.JoinToken, error)
}, pin, poolID string, ttl time.Duration, maxUses int, description, nodeID string) (string, *store.JoinToken, error) {
	return CreateJoinTokenPins(ctx, st, []string{pin}, poolID, ttl, maxUses, description, nodeID)
}

// CreateJoinTokenPins is CreateJoinToken for a token that pins every
// gateway CA of pins (one or two: pki.Bundle.GatewayPins, the CA in force
// first); with two it is a version 2 token (jointoken.Token.WithPin).
func CreateJoinTokenPins(ctx context.Context, st interface {
	JoinTokenCreate(context.Context, *store.JoinTokenCreateParams) (*store.JoinToken, error)
}, pins []string, poolID string, ttl time.Duration, maxUses int, description, nodeID string) (string, *store.JoinToken, error) {
	if len(pins) == 0 || len(pins) > 2 {
		return "", nil, fmt.Errorf("make join token: %d gateway CA pins, want 1 or 2", len(pins))
	}
	tok, err := jointoken.New(pins[0], nil)
	if err != nil {
		return "", nil, fmt.Errorf("make join token: %w", err)
	}
	if len(pins) == 2 {
		if tok, err = tok.WithPin(pins[1]); err != nil {
			return "", nil, fmt.Errorf("make join token: %w", err)
		}
	}
	rec, err := st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: tok.ID(), SecretHash: tok.SecretHash(),
		PoolID: poolID, Description: description, MaxUses: maxUses, ExpiresAt: time.Now().Add(ttl).UTC(), NodeID: nodeID})
	if err != nil {
		return "", nil, fmt.Errorf("store join token: %w", err)
	}
	return tok.String(), rec, nil
}

// gatewayPins are the pins a join token made now carries
// (pki.Bundle.GatewayPins): the gateway CA in force and, while a gateway-CA
// rotation is open, the other CA of the rotation.
func (s *Server) gatewayPins(ctx context.Context) ([]string, error) {
	if _, _, err := s.gatewayPin(ctx); err != nil {
		return nil, err
	}
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	return slices.Clone(s.pins), nil
}

// gatewayPin is the pin of the gateway serving CA from the PKI bundle, and
// the bundle's trust domain. Opening the bundle (HKDF, AES-GCM, key parsing)
// is done once per bundle version, not per request.
func (s *Server) gatewayPin(ctx context.Context) (pin, trustDomain string, err error) {
	b, err := s.store.PKIBundleGet(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return "", "", &Error{Code: apiv1.CodeUnavailable, Message: "no PKI yet: run better-compute pki init"}
	}
	if err != nil {
		return "", "", err
	}
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	if !s.pinOf.Equal(b.UpdatedAt) || s.pin == "" {
		bundle, err := pki.OpenBundle(s.cfg.Secret, b.Sealed)
		if err != nil {
			return "", "", fmt.Errorf("open pki bundle: %w", err)
		}
		s.pin, s.pins, s.pinOf = bundle.GatewayPin(), bundle.GatewayPins(), b.UpdatedAt
	}
	return s.pin, b.TrustDomain, nil
}

func (s *Server) joinTokensList(ctx context.Context, p *iam.Principal, r *apiv1.ListJoinTokensRequest) (*apiv1.ListJoinTokensResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	lp.Within = within(p)
	toks, err := s.store.JoinTokenList(ctx, &lp)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListJoinTokensResponse{NextCursor: next(toks, lp, func(x *store.JoinToken) string { return x.ID })}
	for _, x := range toks {
		out.JoinTokens = append(out.JoinTokens, joinTokenOut(x))
	}
	return out, nil
}

func (s *Server) joinTokensRevoke(ctx context.Context, p *iam.Principal, r *apiv1.RevokeJoinTokenRequest) (*apiv1.RevokeJoinTokenResponse, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	if within(p) != "" {
		jt, err := s.store.JoinTokenGet(ctx, r.GetId())
		if err == nil {
			_, err = s.pool(ctx, p, "id", jt.PoolID)
		}
		if err != nil && (isNotFound(err) || errors.Is(err, store.ErrNotFound)) {
			return nil, &Error{Code: apiv1.CodeNotFound, Field: "id", Message: "no join token " + r.GetId()}
		}
		if err != nil {
			return nil, err
		}
	}
	if err := s.store.JoinTokenRevoke(ctx, r.GetId()); err != nil {
		return nil, fieldNotFound(err, "id", "no join token "+r.GetId())
	}
	t, err := s.store.JoinTokenGet(ctx, r.GetId())
	if err != nil {
		return nil, err
	}
	return &apiv1.RevokeJoinTokenResponse{JoinToken: joinTokenOut(t)}, nil
}

// fieldNotFound names field when err is a missing row.
func fieldNotFound(err error, field, msg string) error {
	if errors.Is(err, store.ErrNotFound) {
		return &Error{Code: apiv1.CodeNotFound, Field: field, Message: msg}
	}
	return err
}

// node resolves a node id within the caller's subtree: a node of a pool
// of another tenant is NOT_FOUND (docs/tenants.md).
func (s *Server) node(ctx context.Context, caller *iam.Principal, nodeID string) (*store.Node, error) {
	if err := id("id", nodeID); err != nil {
		return nil, err
	}
	n, err := s.store.NodeGet(ctx, nodeID)
	if err == nil && within(caller) != "" {
		var pool *store.Pool
		if pool, err = s.store.PoolGet(ctx, n.PoolID); err == nil {
			var ok bool
			if ok, err = s.sees(ctx, caller, pool.TenantID); err == nil && !ok {
				err = store.ErrNotFound
			}
		}
	}
	return n, fieldNotFound(err, "id", "no node "+nodeID)
}

func (s *Server) gatewayOf(ctx context.Context, nodeID string) string {
	if sess, err := s.store.SessionGet(ctx, nodeID); err == nil {
		return sess.GatewayID
	}
	return ""
}

func (s *Server) nodesGet(ctx context.Context, p *iam.Principal, r *apiv1.NodeRequest) (*apiv1.NodeResponse, error) {
	n, err := s.nodeForAnyGrant(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	return &apiv1.NodeResponse{Node: nodeOut(n, s.gatewayOf(ctx, n.ID), true)}, nil
}

func (s *Server) nodesCordon(cordon bool) func(context.Context, *iam.Principal, *apiv1.NodeRequest) (*apiv1.NodeResponse, error) {
	return func(ctx context.Context, p *iam.Principal, r *apiv1.NodeRequest) (*apiv1.NodeResponse, error) {
		n, err := s.node(ctx, p, r.GetId())
		if err != nil {
			return nil, err
		}
		err = store.InTx(ctx, s.store, func(tx cordonTx) error {
			if err := tx.NodeSetCordoned(ctx, n.ID, cordon); err != nil || cordon {
				return err
			}
			// Uncordoning ends an operator's drain: the node is back in
			// service and its budget slot free. Holds of others
			// (remediation, rollouts) stay theirs to end.
			if err := tx.DisruptionRelease(ctx, n.ID, operatorHold); err != nil {
				return err
			}
			if n.State == store.NodeDraining {
				return tx.NodeSetState(ctx, n.ID, store.NodeReady)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return s.nodesGet(ctx, p, r)
	}
}

// nodesSetGPUCount sets the GPUs a node is expected to have (its label
// gpucount.Label), for an intended change such as a board sent for
// repair; the next inventory is judged against it (docs/gpu-health.md,
// "GPU count"). INVALID_ARGUMENT outside 0 to gpucount.Max.
func (s *Server) nodesSetGPUCount(ctx context.Context, p *iam.Principal, r *apiv1.SetGPUCountRequest) (*apiv1.NodeResponse, error) {
	if c := r.GetCount(); c < 0 || c > gpucount.Max {
		return nil, invalid("count", "%d: want 0 to %d GPUs", c, gpucount.Max)
	}
	n, err := s.node(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	if err := s.store.NodeSetLabel(ctx, n.ID, gpucount.Label, strconv.Itoa(int(r.GetCount()))); err != nil {
		return nil, fieldNotFound(err, "id", "no node "+n.ID)
	}
	return s.nodesGet(ctx, p, &apiv1.NodeRequest{Id: n.ID})
}

// operatorHold owns the disruption-budget slot of an operator's drain
// (nodes.drain); any operator's nodes.uncordon ends it.
const operatorHold = store.OperatorOwner

// nodesDrain cordons a node and marks it draining: no new commands reach
// it. It takes a slot of the pool's disruption budget (DESIGN.md, "The
// disruption budget"): refused with CONFLICT, naming the count, while the
// pool has as many nodes out of service as its budget allows.
func (s *Server) nodesDrain(ctx context.Context, p *iam.Principal, r *apiv1.NodeRequest) (*apiv1.NodeResponse, error) {
	n, err := s.node(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	err = store.InTx(ctx, s.store, func(tx drainTx) error {
		// A reserved node is drained after its reservation, not during it
		// (docs/reservations.md, "Disruptions").
		if res, err := tx.NodeReservedNow(ctx, n.ID, nil); err != nil {
			return err
		} else if res != nil {
			return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("node %s is reserved by %s (owner %s) until %s: drain it after "+
				"the reservation ends, or cancel it first (reservations cancel %s)", n.ID, res.ID, res.Owner, res.End.UTC().Format(time.RFC3339), res.ID)}
		}
		a, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: n.ID, Reason: store.DisruptionDraining, Owner: operatorHold})
		if err != nil {
			return err
		}
		switch a.Refusal {
		case store.RefusalBudget:
			return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("pool %s has %d of its %d nodes out of service, its disruption budget "+
				"(%s): drain refused; wait for one to come back, or raise it (better-compute pools set-budget, pools.setBudget)", n.PoolID, a.Budget.OutOfService,
				a.Budget.Nodes, a.Budget.Spec)}
		case store.RefusalHeld:
			return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("node %s is out of service already, held by %s", n.ID, a.Holder)}
		}
		if err := tx.NodeSetCordoned(ctx, r.GetId(), true); err != nil {
			return err
		}
		return tx.NodeSetState(ctx, r.GetId(), store.NodeDraining)
	})
	if err != nil {
		return nil, err
	}
	return s.nodesGet(ctx, p, r)
}

func (s *Server) nodesDelete(ctx context.Context, p *iam.Principal, r *apiv1.NodeRequest) (*apiv1.NodeResponse, error) {
	n, err := s.node(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	err = store.InTx(ctx, s.store, func(tx deleteTx) error {
		// A node holding capacity for someone is not deleted under them:
		// the reservation would stay active holding nothing.
		if res, err := tx.NodeReservedNow(ctx, n.ID, nil); err != nil {
			return err
		} else if res != nil {
			return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("node %s is reserved by %s (owner %s) until %s: delete it after "+
				"the reservation ends, or cancel it first (reservations cancel %s)", n.ID, res.ID, res.Owner, res.End.UTC().Format(time.RFC3339), res.ID)}
		}
		if n.CertSerial != "" {
			if err := tx.RevocationInsert(ctx, &store.Revocation{Serial: n.CertSerial, NodeID: n.ID, Reason: "node deleted"}); err != nil {
				return err
			}
		}
		return tx.NodeDelete(ctx, n.ID)
	})
	if err != nil {
		return nil, err
	}
	// Its session ends at once, not at the gateway's next read of the
	// revocation feed, and its tunnels through this process with it.
	if s.cfg.Revoker != nil && n.CertSerial != "" {
		s.cfg.Revoker.Revoked(ctx, n.ID, n.CertSerial)
	}
	s.live.checkNow()
	return &apiv1.NodeResponse{Node: nodeOut(n, "", false)}, nil
}

// nodesReinstall makes a one-use join token bound to a node, in its pool,
// for a machine whose disk was wiped (DESIGN.md, "Re-join needs proof, never
// a name"): the machine that joins with it takes the node's id and history.
func (s *Server) nodesReinstall(ctx context.Context, p *iam.Principal, r *apiv1.ReinstallNodeRequest) (*apiv1.ReinstallNodeResponse, error) {
	if err := id("node", r.GetNode()); err != nil {
		return nil, err
	}
	n, err := s.store.NodeGet(ctx, r.GetNode())
	if err == nil {
		err = s.poolSeen(ctx, p, n.PoolID) // another tenant's: as one that does not exist
	}
	if err != nil {
		return nil, fieldNotFound(err, "node", "no node "+r.GetNode())
	}
	ttl, err := joinTokenTTL(r.GetTtl())
	if err != nil {
		return nil, err
	}
	pins, err := s.gatewayPins(ctx)
	if err != nil {
		return nil, err
	}
	secret, rec, err := CreateJoinTokenPins(ctx, s.store, pins, n.PoolID, ttl, 1, "reinstall of node "+n.ID, n.ID)
	if err != nil {
		return nil, err
	}
	return &apiv1.ReinstallNodeResponse{JoinToken: joinTokenOut(rec), Token: secret, GatewayUrls: s.regionGateways(ctx, n.PoolID)}, nil
}

// regionGateways are the addresses of the live, not draining gateways of the
// region of pool, as the well-known document lists them; none when they
// cannot be read.
func (s *Server) regionGateways(ctx context.Context, poolID string) []string {
	pool, err := s.store.PoolGet(ctx, poolID)
	if err != nil {
		return nil
	}
	site, err := s.store.SiteGet(ctx, pool.SiteID)
	if err != nil {
		return nil
	}
	gws, err := s.store.GatewayList(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for _, g := range gws {
		if g.Region == site.Region && time.Since(g.HeartbeatAt) < 20*time.Second && !g.Draining && g.Address != "" {
			out = append(out, g.Address)
		}
	}
	return out
}

func (s *Server) gatewaysList(ctx context.Context, _ *iam.Principal, _ *apiv1.ListGatewaysRequest) (*apiv1.ListGatewaysResponse, error) {
	gws, err := s.store.GatewayList(ctx)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListGatewaysResponse{}
	for _, g := range gws {
		out.Gateways = append(out.Gateways, gatewayOut(g))
	}
	return out, nil
}

// gatewayOut is a gateway row as the API gives it, with its state (see
// apiv1.Gateway.state).
func gatewayOut(g *store.Gateway) *apiv1.Gateway {
	state := "up"
	switch {
	case g.DrainRequested && g.Draining && g.Sessions == 0:
		state = "drained"
	case g.Draining || g.DrainRequested:
		state = "draining"
	}
	return &apiv1.Gateway{Id: g.ID, Region: g.Region, Address: g.Address, Version: g.Version,
		Sessions: int32(g.Sessions), MaxStreams: int32(g.MaxStreams), Draining: g.Draining, HeartbeatTime: ts(g.HeartbeatAt),
		Live: time.Since(g.HeartbeatAt) < 20*time.Second, DrainRequested: g.DrainRequested, State: state}
}

// gatewaysDrain records an operator's drain (or undrain) in the gateway's
// row; the gateway, perhaps another process, follows it at its next lease
// renewal (docs/gateway.md, "Draining on command").
func (s *Server) gatewaysDrain(drain bool) func(context.Context, *iam.Principal, *apiv1.DrainGatewayRequest) (*apiv1.DrainGatewayResponse, error) {
	return func(ctx context.Context, _ *iam.Principal, r *apiv1.DrainGatewayRequest) (*apiv1.DrainGatewayResponse, error) {
		if r.GetId() == "" || len(r.GetId()) > 256 {
			return nil, invalid("id", "give a gateway id of 1 to 256 characters")
		}
		g, err := s.store.GatewayDrainSet(ctx, r.GetId(), drain)
		if err != nil {
			return nil, fieldNotFound(err, "id", "no gateway "+r.GetId())
		}
		return &apiv1.DrainGatewayResponse{Gateway: gatewayOut(g)}, nil
	}
}

func (s *Server) processesList(ctx context.Context, _ *iam.Principal, _ *apiv1.ListProcessesRequest) (*apiv1.ListProcessesResponse, error) {
	ps, err := s.store.ProcessList(ctx)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListProcessesResponse{}
	for _, p := range ps {
		out.Processes = append(out.Processes, &apiv1.Process{Id: p.ID, Roles: p.Roles, Hostname: p.Hostname, Pid: int32(p.PID),
			Version: p.Version, Schema: p.Schema, StartTime: ts(p.StartedAt), HeartbeatTime: ts(p.HeartbeatAt)})
	}
	return out, nil
}

func (s *Server) pkiRevoke(ctx context.Context, _ *iam.Principal, r *apiv1.RevokeCertificateRequest) (*apiv1.RevokeCertificateResponse, error) {
	if (r.GetNodeId() == "") == (r.GetSerial() == "") {
		return nil, invalid("nodeId", "give exactly one of nodeId and serial")
	}
	reason := r.GetReason()
	if reason == "" {
		reason = "revoked by an operator"
	}
	rev := &store.Revocation{Reason: reason}
	if r.GetNodeId() != "" {
		n, err := s.store.NodeGet(ctx, r.GetNodeId())
		if err != nil {
			return nil, fieldNotFound(err, "nodeId", "no node "+r.GetNodeId())
		}
		if n.CertSerial == "" {
			return nil, invalid("nodeId", "node %s has no certificate", n.ID)
		}
		rev.Serial, rev.NodeID = n.CertSerial, n.ID
	} else {
		serial, err := apiv1.CanonicalSerial(r.GetSerial())
		if err != nil {
			return nil, invalid("serial", "%v", err)
		}
		rev.Serial = serial
	}
	already, err := s.store.RevocationCheck(ctx, rev.Serial)
	if err != nil {
		return nil, err
	}
	if err := s.store.RevocationInsert(ctx, rev); err != nil {
		return nil, err
	}
	if s.cfg.Revoker != nil {
		s.cfg.Revoker.Revoked(ctx, rev.NodeID, rev.Serial)
	}
	s.live.checkNow() // tunnels to the node through this process end now
	return &apiv1.RevokeCertificateResponse{Serials: []string{rev.Serial}, NodeId: rev.NodeID, AlreadyRevoked: already}, nil
}

func (s *Server) tokensCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreateAPITokenRequest) (*apiv1.CreateAPITokenResponse, error) {
	if !iam.ValidRole(r.GetRole()) {
		return nil, invalid("role", "must be admin, operator or viewer")
	}
	var ttl time.Duration
	if r.Ttl != nil {
		if err := r.GetTtl().CheckValid(); err != nil || r.GetTtl().AsDuration() <= 0 || r.GetTtl().AsDuration() > MaxAPITokenTTL {
			return nil, invalid("ttl", "must be a positive duration of at most %v", MaxAPITokenTTL)
		}
		ttl = r.GetTtl().AsDuration()
	}
	tenant, err := s.tenant(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	secret, t, err := iam.Create(ctx, s.store, iam.CreateParams{Role: r.GetRole(), Description: r.GetDescription(), TTL: ttl,
		AllowCIDRs: r.GetAllowCidrs(), TenantID: tenant.ID})
	if err != nil {
		if !errors.Is(err, store.ErrConflict) && strings.Contains(err.Error(), "allowed CIDR") {
			return nil, invalid("allowCidrs", "%v", err)
		}
		return nil, err
	}
	return &apiv1.CreateAPITokenResponse{ApiToken: apiTokenOut(t), Token: secret}, nil
}

func (s *Server) tokensList(ctx context.Context, p *iam.Principal, r *apiv1.ListAPITokensRequest) (*apiv1.ListAPITokensResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	lp.Within = within(p)
	toks, err := s.store.APITokenList(ctx, &lp)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListAPITokensResponse{NextCursor: next(toks, lp, func(x *store.APIToken) string { return x.ID })}
	for _, x := range toks {
		out.ApiTokens = append(out.ApiTokens, apiTokenOut(x))
	}
	return out, nil
}

func (s *Server) tokensRevoke(ctx context.Context, p *iam.Principal, r *apiv1.RevokeAPITokenRequest) (*apiv1.RevokeAPITokenResponse, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	if within(p) != "" {
		ok, err := s.tokenSeen(ctx, p, r.GetId())
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, &Error{Code: apiv1.CodeNotFound, Field: "id", Message: "no token " + r.GetId()}
		}
	}
	if err := s.store.APITokenRevoke(ctx, r.GetId()); err != nil {
		return nil, fieldNotFound(err, "id", "no token "+r.GetId())
	}
	s.auth.Forget()
	s.live.checkNow() // its event streams and tunnels in this process end now
	return &apiv1.RevokeAPITokenResponse{}, nil
}

// labelsMatch reports whether labels hold every selector entry.
func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}
