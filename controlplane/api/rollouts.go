package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rollouts"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/installer/manifest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Limits of rollouts.create.
const (
	MaxRolloutCanary = 100
	MaxRolloutSoak   = 24 * time.Hour
	// MaxRolloutBake bounds a rollout's bake (issue 30).
	MaxRolloutBake    = 24 * time.Hour
	MinRolloutTimeout = time.Second
	MaxRolloutTimeout = 24 * time.Hour
)

// rolloutsCreate checks a rollout, verifies its release against the
// configured pins, and writes it (docs/rollouts.md, "rollouts.create").
func (s *Server) rolloutsCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreateRolloutRequest) (*apiv1.RolloutResponse, error) {
	version := r.GetVersion()
	switch {
	case version == "":
		return nil, invalid("version", "is required: the bcd release to roll out, like 0.2.0")
	case !manifest.ValidVersion(version):
		return nil, invalid("version", "%q is not a release version: want semantic versioning without a leading v, like 0.2.0", version)
	case r.GetPool() == "":
		return nil, invalid("pool", "is required: the pool (id or name) whose nodes to upgrade")
	case r.GetCanary() < 0 || r.GetCanary() > MaxRolloutCanary:
		return nil, invalid("canary", "must be 1 to %d nodes (0: 1)", MaxRolloutCanary)
	}
	wave, err := store.ParseCount("wave", cmpOr(r.GetWave(), rollouts.DefaultWave))
	if err != nil {
		return nil, invalid("wave", "%v", err)
	}
	maxOut, err := store.ParseCount("maxUnavailable", cmpOr(r.GetMaxUnavailable(), wave))
	if err != nil {
		return nil, invalid("maxUnavailable", "%v", err)
	}
	soak, err := durationIn("soak", r.GetSoak(), rollouts.DefaultSoak, 0, MaxRolloutSoak)
	if err != nil {
		return nil, err
	}
	timeout, err := durationIn("timeout", r.GetTimeout(), rollouts.DefaultTimeout, MinRolloutTimeout, MaxRolloutTimeout)
	if err != nil {
		return nil, err
	}
	bake, err := durationIn("bake", r.GetBake(), rollouts.DefaultBake, 0, MaxRolloutBake)
	if err != nil {
		return nil, err
	}
	if base := r.GetBaseUrl(); base != "" && !downloadsRouteURL(base) {
		return nil, invalid("baseUrl", "want an http(s)://host/path URL of a downloads route, such as https://compute.example.com/api/downloads")
	}
	// A rollout is its pool's tenant's (docs/tenants.md): a pool outside
	// the caller's subtree is NOT_FOUND, and the rollout's nodes are the
	// pool's, so it never reaches a node outside it.
	pool, err := s.pool(ctx, p, "pool", r.GetPool())
	if err != nil {
		return nil, err
	}
	// The release is checked first: without it no base URL would help.
	if err := s.verifyRelease(ctx, pool.ID, version); err != nil {
		return nil, err
	}
	base := r.GetBaseUrl()
	if base == "" {
		if base = s.downloadsURL(ctx); base == "" {
			return nil, invalid("baseUrl", "this control plane serves no downloads (set downloads.dir) and the request names no baseUrl")
		}
	}
	ro, err := s.store.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: pool.ID, Version: version, BaseURL: strings.TrimRight(base, "/"),
		Canary: max(1, int(r.GetCanary())), Wave: wave, MaxUnavailable: maxOut, Soak: soak, Timeout: timeout,
		Bake: bake, Drain: r.Drain == nil || r.GetDrain(), RequireEvidence: r.GetRequireEvidence(), CreatedBy: "token:" + p.TokenID})
	if errors.Is(err, store.ErrConflict) {
		open, _ := s.store.RolloutList(ctx, &store.RolloutListParams{PoolID: pool.ID, Active: true, ListParams: store.ListParams{Limit: 1}})
		msg := fmt.Sprintf("pool %s has a rollout in progress or halted", pool.Name)
		if len(open) == 1 {
			msg = fmt.Sprintf("pool %s has rollout %s (%s, to %s): abort it first (rollouts abort %s)", pool.Name, open[0].ID, open[0].State, open[0].Version, open[0].ID)
		}
		return nil, &Error{Code: apiv1.CodeConflict, Field: "pool", Message: msg}
	}
	if err != nil {
		return nil, err
	}
	return s.rolloutResponse(ctx, ro)
}

// downloadsRouteURL reports whether base is an http(s)://host/path URL
// without query or fragment, as a downloads route's base is.
func downloadsRouteURL(base string) bool {
	u, err := url.Parse(base)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" && u.RawQuery == "" && u.Fragment == ""
}

// verifyRelease checks that the downloads folder holds version with a
// signed manifest that verifies against downloads.releasePins and lists a
// bcd binary for every os/arch of the pool's nodes. Each failure is
// INVALID_ARGUMENT on version, saying what is wrong.
func (s *Server) verifyRelease(ctx context.Context, poolID, version string) error {
	if s.cfg.Releases == nil {
		return invalid("version", "this control plane serves no downloads (set downloads.dir): a rollout needs the release there to verify it before any node is touched")
	}
	if len(s.cfg.ReleasePins) == 0 {
		return invalid("version", "no release keys are pinned (downloads.releasePins): a rollout verifies the release against them before any node is touched")
	}
	if !slices.Contains(s.cfg.Releases.Versions("bcd"), version) {
		return invalid("version", "bcd %s for Linux is not in the downloads folder (it holds %s)", version, orNone(s.cfg.Releases.Versions("bcd")))
	}
	mf, sig, err := s.cfg.Releases.Manifest(version)
	if err != nil {
		return invalid("version", "release %s: %v", version, err)
	}
	pins, _, err := s.pinsInForce(ctx)
	if err != nil {
		return err
	}
	m, err := manifest.Verify(mf, sig, pins, s.now())
	if err != nil {
		return invalid("version", "release %s does not verify against downloads.releasePins nor the pins release pins add accepted: %v", version, err)
	}
	if m.Version != version {
		return invalid("version", "release %s: its signed manifest is for version %s", version, m.Version)
	}
	nodes, err := s.store.NodeList(ctx, &store.NodeListParams{PoolID: poolID, ListParams: store.ListParams{Limit: store.MaxListLimit}})
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for cursor := ""; ; {
		for _, n := range nodes {
			if n.OS != "" && n.Arch != "" {
				want[n.OS+"/"+n.Arch] = true
			}
			cursor = n.ID
		}
		if len(nodes) < store.MaxListLimit {
			break
		}
		if nodes, err = s.store.NodeList(ctx, &store.NodeListParams{PoolID: poolID, ListParams: store.ListParams{Cursor: cursor, Limit: store.MaxListLimit}}); err != nil {
			return err
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		goos, goarch, _ := strings.Cut(k, "/")
		if _, ok := m.Find(manifest.KindBinary, "bcd", goos, goarch); !ok {
			return invalid("version", "release %s lists no bcd binary for %s, which nodes of the pool run", version, k)
		}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// now is the API's clock.
func (s *Server) now() time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now()
	}
	return time.Now()
}

// durationIn checks an optional duration: def when unset, else lo to hi.
func durationIn(field string, d *durationpb.Duration, def, lo, hi time.Duration) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil || d.AsDuration() < lo || d.AsDuration() > hi {
		return 0, invalid(field, "must be %v to %v", lo, hi)
	}
	return d.AsDuration(), nil
}

// rolloutsList lists the rollouts of the caller's subtree's pools: a page
// may hold fewer than its limit; the cursor follows the page read.
func (s *Server) rolloutsList(ctx context.Context, p *iam.Principal, r *apiv1.ListRolloutsRequest) (*apiv1.ListRolloutsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	q := &store.RolloutListParams{ListParams: lp, Active: r.GetActive()}
	if r.GetPool() != "" {
		pool, err := s.pool(ctx, p, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		q.PoolID = pool.ID
	}
	ros, err := s.store.RolloutList(ctx, q)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListRolloutsResponse{NextCursor: next(ros, lp, func(r *store.Rollout) string { return r.ID })}
	seen := s.poolsSeen(p)
	for _, ro := range ros {
		if ok, err := seen(ctx, ro.PoolID); err != nil {
			return nil, err
		} else if !ok {
			continue
		}
		nodes, err := s.store.RolloutNodes(ctx, ro.ID)
		if err != nil {
			return nil, err
		}
		out.Rollouts = append(out.Rollouts, rolloutOut(ro, nodes))
	}
	return out, nil
}

func (s *Server) rolloutsGet(ctx context.Context, p *iam.Principal, r *apiv1.GetRolloutRequest) (*apiv1.RolloutResponse, error) {
	ro, err := s.rollout(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	return s.rolloutResponse(ctx, ro)
}

// rollout reads the rollout a request names; one of a pool outside p's
// subtree is NOT_FOUND, as one that does not exist.
func (s *Server) rollout(ctx context.Context, p *iam.Principal, id string) (*store.Rollout, error) {
	if id == "" || len(id) > 128 {
		return nil, invalid("id", "is required: a rollout id (rollouts list shows them)")
	}
	ro, err := s.store.RolloutGet(ctx, id)
	if err == nil {
		err = s.poolSeen(ctx, p, ro.PoolID)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "id", Message: fmt.Sprintf("no rollout %q", id)}
	}
	return ro, err
}

// rolloutsAction is pause, resume and abort: the move from the states it
// is allowed in to state.
func (s *Server) rolloutsAction(verb, state string, from ...string) func(context.Context, *iam.Principal, *apiv1.RolloutActionRequest) (*apiv1.RolloutResponse, error) {
	return func(ctx context.Context, p *iam.Principal, r *apiv1.RolloutActionRequest) (*apiv1.RolloutResponse, error) {
		if len(r.GetReason()) > 1024 {
			return nil, invalid("reason", "must be at most 1,024 bytes")
		}
		ro, err := s.rollout(ctx, p, r.GetId())
		if err != nil {
			return nil, err
		}
		actor := "token:" + p.TokenID
		u := &store.RolloutUpdateParams{ID: ro.ID, From: from, State: state, Actor: actor}
		if state == store.RolloutAborted {
			u.Reason = cmpOr(r.GetReason(), "aborted by "+actor)
		}
		err = store.InTx(ctx, s.store, func(tx rolloutStopTx) error {
			var err error
			if ro, err = tx.RolloutUpdate(ctx, u); err != nil {
				return err
			}
			if state != store.RolloutAborted {
				return nil
			}
			// The rollout's holds go back: nodes mid-upgrade finish on
			// their own, and count again as the liveness sees them.
			nodes, err := tx.RolloutNodes(ctx, ro.ID)
			if err != nil {
				return err
			}
			for _, n := range nodes {
				if n.DisruptionOwner == store.RolloutOwner(ro.ID) {
					if err := tx.DisruptionRelease(ctx, n.NodeID, store.RolloutOwner(ro.ID)); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if errors.Is(err, store.ErrConflict) {
			cur, _ := s.store.RolloutGet(ctx, r.GetId())
			st := "in another state"
			if cur != nil {
				st = cur.State
			}
			return nil, &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("rollout %s is %s: %s needs it %s", r.GetId(), st, verb, strings.Join(from, " or "))}
		}
		if err != nil {
			return nil, err
		}
		return s.rolloutResponse(ctx, ro)
	}
}

// rolloutResponse is a rollout and its nodes in the API's form.
func (s *Server) rolloutResponse(ctx context.Context, ro *store.Rollout) (*apiv1.RolloutResponse, error) {
	nodes, err := s.store.RolloutNodes(ctx, ro.ID)
	if err != nil {
		return nil, err
	}
	out := &apiv1.RolloutResponse{Rollout: rolloutOut(ro, nodes)}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, &apiv1.RolloutNode{NodeId: n.NodeID, Hostname: n.Hostname, State: n.State, Wave: int32(n.Wave),
			PreviousVersion: n.PreviousVersion, BcdVersion: n.BCDVersion, UpgradeCommandId: n.UpgradeCommandID,
			RollbackCommandId: n.RollbackCommandID, Reason: n.Reason, StateTime: ts(n.StateSince), Connected: n.Connected,
			Drops: int32(n.Drops)})
	}
	return out, nil
}

// rolloutOut is a rollout in the API's form, with its progress.
func rolloutOut(ro *store.Rollout, nodes []*store.RolloutNode) *apiv1.Rollout {
	pr := &apiv1.RolloutProgress{Nodes: int32(len(nodes))}
	for _, n := range nodes {
		switch n.State {
		case store.RolloutNodePending:
			pr.Pending++
		case store.RolloutNodeUpgraded:
			pr.Upgraded++
		case store.RolloutNodeSkipped:
			pr.Skipped++
		case store.RolloutNodeFailed:
			pr.Failed++
		case store.RolloutNodeRolledBack:
			pr.RolledBack++
		default:
			pr.Out++
		}
	}
	out := &apiv1.Rollout{Id: ro.ID, PoolId: ro.PoolID, Version: ro.Version, BaseUrl: ro.BaseURL, Canary: int32(ro.Canary),
		Wave: ro.Wave, MaxUnavailable: ro.MaxUnavailable, Soak: durationpb.New(ro.Soak), Timeout: durationpb.New(ro.Timeout),
		Drain: ro.Drain, State: ro.State, CurrentWave: int32(ro.CurrentWave), Reason: ro.Reason, FailedNodeId: ro.FailedNodeID,
		CreatedBy: ro.CreatedBy, CreateTime: ts(ro.CreatedAt), UpdateTime: ts(ro.UpdatedAt), FinishTime: tsp(ro.FinishedAt), Progress: pr,
		Bake: durationpb.New(ro.Bake), RequireEvidence: ro.RequireEvidence}
	for _, g := range ro.Gates {
		out.HealthGates = append(out.HealthGates, healthGateMessage(g))
	}
	switch {
	case ro.Baking():
		// The bake's clock as the row has it (this process's clock for a
		// running bake: a display, not a decision).
		out.Phase, out.BakeElapsed, out.BakeStartTime = "bake", durationpb.New(ro.BakeDone(time.Now())), tsp(ro.BakeStartedAt)
	case store.RolloutActive(ro.State) || ro.State == store.RolloutHalted:
		out.Phase = "waves"
	}
	return out
}

// healthGateMessage is a wave's health gate on the wire.
func healthGateMessage(g healthgate.Report) *apiv1.RolloutHealthGate {
	m := &apiv1.RolloutHealthGate{Wave: int32(g.Wave), Verdict: g.Verdict, Comparison: g.Comparison, StartTime: ts(g.From),
		EndTime: ts(g.To), UpgradedNodes: int32(g.UpgradedNodes), ComparisonNodes: int32(g.ComparisonNodes),
		UpgradedNodeHours: g.UpgradedNodeHours, ComparisonNodeHours: g.ComparisonNodeHours, ExtendedUntil: tsp(g.ExtendedUntil),
		Reason: g.Reason, Pending: g.Pending}
	for _, r := range g.Measures {
		m.Measures = append(m.Measures, &apiv1.RolloutHealthMeasure{Name: r.Name, Unit: r.Unit, UpgradedCount: r.Upgraded.Count,
			UpgradedExposure: r.Upgraded.Exposure, ComparisonCount: r.Comparison.Count, ComparisonExposure: r.Comparison.Exposure,
			Expected: r.Expected, PValue: r.P, Worse: r.Worse, Skipped: r.Skipped})
	}
	return m
}
