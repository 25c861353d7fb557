package api

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/policy"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Waker is told right after commands commit, so the gateways holding their
// nodes' sessions dispatch at once instead of on their 1-second loop.
type Waker interface {
	Wake(ctx context.Context, nodeIDs []string)
}

// Revoker is told right after a revocation commits, so the gateway holding
// the node's session ends it at once instead of at its next read of the
// revocation feed. nodeID is empty for a revocation by serial alone.
type Revoker interface {
	Revoked(ctx context.Context, nodeID, serial string)
}

// apiKinds are the kinds commands.create accepts: the protocol's
// (sessionv1.Kinds) but reboot and drain.
var apiKinds = []string{sessionv1.KindExec, sessionv1.KindInventoryRefresh, sessionv1.KindPowerStatus, sessionv1.KindPowerOn,
	sessionv1.KindPowerOff, sessionv1.KindPowerSoftOff, sessionv1.KindPowerCycle, sessionv1.KindPowerReset,
	sessionv1.KindBootSet, sessionv1.KindUpgrade}

// kindsHelp lists apiKinds for commands.create's errors: "exec, ..., boot.set
// or upgrade".
func kindsHelp() string {
	return strings.Join(apiKinds[:len(apiKinds)-1], ", ") + " or " + apiKinds[len(apiKinds)-1]
}

// commandsCreate validates the request and stores each command's spec in
// its session-protocol form (sessionv1.MarshalSpec), the form the gateway
// sends as it is.
func (s *Server) commandsCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreateCommandsRequest) (*apiv1.CreateCommandsResponse, error) {
	var spec *sessionv1.Command
	switch kind := r.GetKind(); {
	case kind == sessionv1.KindExec:
		e := r.GetExec()
		if len(e.GetArgv()) == 0 || e.GetArgv()[0] == "" {
			return nil, invalid("exec.argv", "is required for kind exec")
		}
		if e.GetOutputLimitBytes() > MaxOutputLimit {
			return nil, invalid("exec.outputLimitBytes", "at most %d", MaxOutputLimit)
		}
		for k := range e.GetEnv() {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return nil, invalid("exec.env", "%q is not a variable name", k)
			}
		}
		// Root is one right: for a caller no policy binds, refused by its
		// role before the targets are read (decided again on each target).
		if e.GetAsRoot() {
			if err := s.decideOnNodes(ctx, p, nil, policy.ActionCommandsCreateAsRoot); err != nil {
				if e, ok := err.(*Error); ok && !iam.Allows(p.Role, store.RoleAdmin) {
					e.Field = "exec.asRoot"
					e.Message = "a command as root needs an admin token (role " + p.Role + "); without asRoot it runs as the node's command user"
				}
				return nil, err
			}
		}
		limit := e.GetOutputLimitBytes()
		if limit == 0 {
			limit = DefaultOutputLimit
		}
		spec = &sessionv1.Command{Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: e.GetArgv(), Env: e.GetEnv(),
			Cwd: e.GetCwd(), OutputLimitBytes: limit, AsRoot: e.GetAsRoot()}}}
	case kind == sessionv1.KindInventoryRefresh:
		if r.Exec != nil {
			return nil, invalid("exec", "only for kind exec")
		}
		spec = &sessionv1.Command{}
	case isPowerKind(kind) || kind == sessionv1.KindBootSet:
		b, err := bmcCommandSpec(r)
		if err != nil {
			return nil, err
		}
		spec = b
	case kind == sessionv1.KindUpgrade:
		b, err := s.upgradeCommandSpec(ctx, r)
		if err != nil {
			return nil, err
		}
		spec = b
	case kind == "":
		return nil, invalid("kind", "is required: %s", kindsHelp())
	default:
		return nil, invalid("kind", "unknown kind %q: want %s", kind, kindsHelp())
	}
	if r.GetKind() != sessionv1.KindBootSet && r.Boot != nil {
		return nil, invalid("boot", "only for kind boot.set")
	}
	if !isPowerKind(r.GetKind()) && r.Power != nil {
		return nil, invalid("power", "only for the power.* kinds")
	}
	if r.GetKind() != sessionv1.KindUpgrade && r.Upgrade != nil {
		return nil, invalid("upgrade", "only for kind upgrade")
	}
	// The checks above give the API's own messages; the protocol's rule is
	// the last word (a request that passes them and fails it is refused,
	// never sent).
	if err := sessionv1.CheckSpec(r.GetKind(), spec); err != nil {
		return nil, invalid("kind", "%v", err)
	}
	stored, err := sessionv1.MarshalSpec(spec)
	if err != nil {
		return nil, err
	}
	timeout := DefaultCommandTimeout
	if r.Timeout != nil {
		if err := r.GetTimeout().CheckValid(); err != nil || r.GetTimeout().AsDuration() <= 0 || r.GetTimeout().AsDuration() > MaxCommandTimeout {
			return nil, invalid("timeout", "must be above 0 and at most %v", MaxCommandTimeout)
		}
		timeout = r.GetTimeout().AsDuration()
	}
	if len(r.GetIdempotencyKey()) > 128 {
		return nil, invalid("idempotencyKey", "at most 128 characters")
	}
	nodes, err := s.targets(ctx, p, r)
	if err != nil {
		return nil, err
	}
	// Each target is decided (a policy may scope commands to a pool), and
	// asRoot as commands.createAsRoot: root is one right, the rule of a
	// root shell (tunnelsCreate).
	actions := []string{"commands.create"}
	if r.GetExec().GetAsRoot() {
		actions = append(actions, policy.ActionCommandsCreateAsRoot)
	}
	if err := s.decideOnNodes(ctx, p, nodes, actions...); err != nil {
		if e, ok := err.(*Error); ok && r.GetExec().GetAsRoot() && !iam.Allows(p.Role, store.RoleAdmin) {
			e.Field = "exec.asRoot"
			e.Message = "a command as root needs an admin token (role " + p.Role + "); without asRoot it runs as the node's command user: " + e.Message
		}
		return nil, err
	}
	if r.GetExec().GetAsRoot() {
		// A root command a grant may have allowed runs no longer than the
		// grant (docs/access.md): queued for a node offline, it expires.
		if end, ok := s.grantsEnd(ctx, p); ok {
			timeout = min(timeout, max(end.Sub(s.now()), time.Second))
		}
	}
	cmds, err := s.store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: nodes, Kind: r.GetKind(), SessionSpec: stored,
		IdempotencyKey: r.GetIdempotencyKey(), KeyOfCreator: true, CreatedBy: "token:" + p.TokenID, Timeout: timeout})
	if err != nil {
		return nil, err
	}
	if s.waker != nil {
		s.waker.Wake(ctx, nodes)
	}
	out := &apiv1.CreateCommandsResponse{}
	for _, c := range cmds {
		out.BatchId = c.BatchID
		out.Commands = append(out.Commands, commandOut(c))
	}
	return out, nil
}

// specOut shows a command's stored spec (the session-protocol form) in the
// API's messages: Command.exec, power, boot or upgrade. A spec that does
// not decode is left out.
func specOut(out *apiv1.Command, c *store.Command) {
	spec := &sessionv1.Command{}
	if len(c.SessionSpec) == 0 || sessionv1.UnmarshalSpec(c.SessionSpec, spec) != nil {
		return
	}
	switch x := spec.GetSpec().(type) {
	case *sessionv1.Command_Exec:
		out.Exec = &apiv1.ExecSpec{Argv: x.Exec.GetArgv(), Env: x.Exec.GetEnv(), Cwd: x.Exec.GetCwd(), AsRoot: x.Exec.GetAsRoot(),
			OutputLimitBytes: x.Exec.GetOutputLimitBytes()}
	case *sessionv1.Command_Power:
		out.Power = &apiv1.PowerSpec{Bmc: x.Power.GetBmc()}
	case *sessionv1.Command_Boot:
		out.Boot = &apiv1.BootSpec{Bmc: x.Boot.GetBmc(), Device: x.Boot.GetDevice(), Persistent: x.Boot.GetPersistent()}
	case *sessionv1.Command_Upgrade:
		out.Upgrade = &apiv1.UpgradeSpec{Version: x.Upgrade.GetVersion(), BaseUrl: x.Upgrade.GetBaseUrl()}
	}
}

// targets resolves node ids or a pool and selector to node ids.
// Every target must lie within p's subtree (docs/tenants.md).
func (s *Server) targets(ctx context.Context, p *iam.Principal, r *apiv1.CreateCommandsRequest) ([]string, error) {
	switch {
	case len(r.GetNodeIds()) > 0 && r.GetPool() != "":
		return nil, invalid("nodeIds", "give nodeIds or pool, not both")
	case len(r.GetNodeIds()) > MaxTargets:
		return nil, invalid("nodeIds", "at most %d nodes", MaxTargets)
	case len(r.GetNodeIds()) > 0:
		var ids []string
		seen := map[string]bool{}
		for _, nid := range r.GetNodeIds() {
			if err := id("nodeIds", nid); err != nil {
				return nil, err
			}
			if !seen[nid] {
				seen[nid] = true
				ids = append(ids, nid)
			}
		}
		var missing []string
		if within(p) == "" {
			var err error
			if missing, err = s.store.NodesMissing(ctx, ids); err != nil {
				return nil, err
			}
		} else {
			// A tenant's caller: every id is resolved within its subtree,
			// so that a node of another tenant is missing exactly as one
			// that does not exist, named together in one NOT_FOUND
			// (docs/tenants.md): which ids exist elsewhere never shows.
			var asRoot error
			for _, nid := range ids {
				// An exec may go to a node outside the caller's subtree
				// that a reservation grants it exec on now (as the node's
				// command user: docs/reservations.md).
				var grant *store.ReservationGrant
				var err error
				if r.GetKind() == sessionv1.KindExec {
					_, grant, err = s.nodeFor(ctx, p, nid, store.GrantExec)
				} else {
					_, err = s.node(ctx, p, nid)
				}
				switch {
				case errors.Is(err, store.ErrNotFound) || isNotFound(err):
					missing = append(missing, nid)
				case err != nil:
					return nil, err
				case grant != nil && r.GetExec().GetAsRoot() && asRoot == nil:
					asRoot = &Error{Code: apiv1.CodePermissionDenied, Field: "exec.asRoot", Message: "reservation " + grant.ReservationID +
						" grants exec on node " + nid + " as the node's command user, not as root"}
				}
			}
			if len(missing) == 0 && asRoot != nil {
				return nil, asRoot
			}
		}
		if len(missing) > 0 {
			return nil, &Error{Code: apiv1.CodeNotFound, Field: "nodeIds", Message: "no node " + strings.Join(missing[:min(len(missing), 5)], ", ")}
		}
		skewed, err := s.clockSkewed(ctx)
		if err != nil {
			return nil, err
		}
		var refused []string
		for _, nid := range ids {
			if skewed[nid] {
				refused = append(refused, nid)
			}
		}
		if len(refused) > 0 {
			return nil, &Error{Code: apiv1.CodeConflict, Field: "nodeIds", Message: "node " + strings.Join(refused[:min(len(refused), 5)], ", ") +
				" is " + store.NodeClockSkewed + ": its clock is more than host.gateway.clockSkewLimit off the gateways' and it takes no new commands " +
				"until it is fixed (run chrony or systemd-timesyncd on it; nodes get shows the skew)"}
		}
		return ids, nil
	case r.GetPool() != "":
		pool, err := s.pool(ctx, p, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		skewed, err := s.clockSkewed(ctx)
		if err != nil {
			return nil, err
		}
		var ids []string
		lp := store.NodeListParams{PoolID: pool.ID, ListParams: store.ListParams{Limit: store.MaxListLimit}}
		for {
			nodes, err := s.store.NodeList(ctx, &lp)
			if err != nil {
				return nil, err
			}
			for _, n := range nodes {
				if !n.Cordoned && !skewed[n.ID] && labelsMatch(n.Labels, r.GetSelector()) {
					ids = append(ids, n.ID)
				}
			}
			if len(nodes) < lp.Limit {
				break
			}
			lp.Cursor = nodes[len(nodes)-1].ID
		}
		if len(ids) == 0 {
			return nil, &Error{Code: apiv1.CodeNotFound, Field: "pool", Message: "no uncordoned node of pool " + r.GetPool() + " that is not " + store.NodeClockSkewed + " matches"}
		}
		return ids, nil
	}
	return nil, invalid("nodeIds", "give nodeIds or pool")
}

// clockSkewed returns the ids of the nodes that are clock-skewed: they take
// no new commands (issue 36). There are few, if any.
func (s *Server) clockSkewed(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	lp := store.NodeListParams{State: store.NodeClockSkewed, ListParams: store.ListParams{Limit: store.MaxListLimit}}
	for {
		nodes, err := s.store.NodeList(ctx, &lp)
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			out[n.ID] = true
		}
		if len(nodes) < lp.Limit {
			return out, nil
		}
		lp.Cursor = nodes[len(nodes)-1].ID
	}
}

// HiddenEnvValue replaces each value of an exec command's environment in
// what a viewer reads (commands.get, commands.list): the names show, the
// values may hold credentials; operators and admins see them (issue 29,
// docs/security.md).
const HiddenEnvValue = "<hidden>"

// forRole hides what c's reader may not see: a viewer gets the names of an
// exec command's environment, never the values. It returns c.
func forRole(c *apiv1.Command, p *iam.Principal) *apiv1.Command {
	if p != nil && iam.Allows(p.Role, store.RoleOperator) {
		return c
	}
	if x := c.GetExec(); x != nil && len(x.Env) > 0 {
		env := make(map[string]string, len(x.Env))
		for k := range x.Env {
			env[k] = HiddenEnvValue
		}
		x.Env = env
	}
	return c
}

func (s *Server) commandsGet(ctx context.Context, p *iam.Principal, r *apiv1.GetCommandRequest) (*apiv1.GetCommandResponse, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	c, err := s.command(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	out := forRole(commandOut(c), p)
	resp := &apiv1.GetCommandResponse{Command: out}
	if r.GetIncludeOutput() {
		var after int64
		if cur := r.GetOutputCursor(); cur != "" {
			if after, err = strconv.ParseInt(cur, 10, 64); err != nil || after < 0 {
				return nil, invalid("outputCursor", "%q is not an output cursor (the nextOutputCursor of an earlier answer)", cur)
			}
		}
		// One page at a time (issue 28): a command's whole output (up to
		// its outputLimitBytes, 64 MiB at most) is never read at once.
		page, err := s.store.CommandOutputPage(ctx, &store.CommandOutputPageParams{CommandID: c.ID, AfterSeq: after,
			MaxBytes: store.MaxOutputPage})
		if err != nil {
			return nil, err
		}
		var stdout, stderr []byte
		for _, ch := range page.Chunks {
			if ch.Stream == store.StreamStderr {
				stderr = append(stderr, ch.Data...)
			} else {
				stdout = append(stdout, ch.Data...)
			}
		}
		out.Stdout, out.StdoutBase64 = outputForms(stdout)
		out.Stderr, out.StderrBase64 = outputForms(stderr)
		if page.More {
			resp.NextOutputCursor = strconv.FormatInt(page.Chunks[len(page.Chunks)-1].Seq, 10)
		}
	}
	return resp, nil
}

// command resolves a command id within the caller's subtree: a command of
// a node of another tenant's pool is NOT_FOUND (docs/tenants.md).
func (s *Server) command(ctx context.Context, p *iam.Principal, cmdID string) (*store.Command, error) {
	if err := id("id", cmdID); err != nil {
		return nil, err
	}
	c, err := s.store.CommandGet(ctx, cmdID)
	// A token reads and cancels the commands it made (such as an exec a
	// reservation's grant allowed on a node outside its subtree).
	if err == nil && within(p) != "" && c.CreatedBy != "token:"+p.TokenID {
		if _, nerr := s.node(ctx, p, c.NodeID); isNotFound(nerr) {
			err = store.ErrNotFound
		} else if nerr != nil {
			return nil, nerr
		}
	}
	return c, fieldNotFound(err, "id", "no command "+cmdID)
}

var commandStates = []string{store.CommandQueued, store.CommandDispatched, store.CommandAccepted, store.CommandRunning,
	store.CommandSucceeded, store.CommandFailed, store.CommandCancelled, store.CommandExpired, store.CommandLost}

func (s *Server) commandsList(ctx context.Context, p *iam.Principal, r *apiv1.ListCommandsRequest) (*apiv1.ListCommandsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	if r.GetState() != "" && !slices.Contains(commandStates, r.GetState()) {
		return nil, invalid("state", "unknown state %q", r.GetState())
	}
	lp.Within = within(p)
	cmds, err := s.store.CommandList(ctx, &store.CommandListParams{ListParams: lp, NodeID: r.GetNodeId(), BatchID: r.GetBatchId(), State: r.GetState()})
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListCommandsResponse{NextCursor: next(cmds, lp, func(x *store.Command) string { return x.ID })}
	for _, c := range cmds {
		out.Commands = append(out.Commands, forRole(commandOut(c), p))
	}
	return out, nil
}

func (s *Server) commandsCancel(ctx context.Context, p *iam.Principal, r *apiv1.CancelCommandRequest) (*apiv1.CancelCommandResponse, error) {
	if _, err := s.command(ctx, p, r.GetId()); err != nil {
		return nil, err
	}
	c, err := s.store.CommandRequestCancel(ctx, r.GetId())
	if err != nil {
		return nil, fieldNotFound(err, "id", "no command "+r.GetId())
	}
	if s.waker != nil && !store.IsTerminal(c.State) {
		s.waker.Wake(ctx, []string{c.NodeID})
	}
	return &apiv1.CancelCommandResponse{Command: commandOut(c)}, nil
}

// nodeStates are the states nodes.list filters by (store.Node.State).
var nodeStates = []string{store.NodeJoined, store.NodeReady, store.NodeUnreachable, store.NodePoweredOff, store.NodeDraining, store.NodeClockSkewed}

func (s *Server) nodesList(ctx context.Context, p *iam.Principal, r *apiv1.ListNodesRequest) (*apiv1.ListNodesResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	if h := r.GetGpuHealth(); h != "" && h != "degraded" && h != "failed" {
		return nil, invalid("gpuHealth", "want degraded or failed")
	}
	if r.GetMinGpus() < 0 {
		return nil, invalid("minGpus", "must not be negative")
	}
	if st := r.GetState(); st != "" && !slices.Contains(nodeStates, st) {
		return nil, invalid("state", "unknown state %q: want %s", st, strings.Join(nodeStates, ", "))
	}
	lp.Within = within(p)
	params := store.NodeListParams{ListParams: lp, State: r.GetState()}
	if r.GetPool() != "" {
		pool, err := s.pool(ctx, p, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		params.PoolID = pool.ID
	}
	limit := lp.Limit
	if limit == 0 {
		limit = 100
	}
	filtered := r.GetGpuModel() != "" || r.GetMinGpus() > 0 || r.GetGpuHealth() != ""
	out := &apiv1.ListNodesResponse{}
	// GPU filters read the inventory: scan pages until the page is full.
	deadline := time.Now().Add(10 * time.Second)
	for {
		params.Limit = limit
		if filtered {
			params.Limit = store.MaxListLimit
		}
		nodes, err := s.store.NodeList(ctx, &params)
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			node := nodeOut(n, "", false)
			if !gpuMatch(node, r) {
				continue
			}
			out.Nodes = append(out.Nodes, node)
			if len(out.Nodes) == limit {
				out.NextCursor = n.ID
				return s.withGateways(ctx, out), nil
			}
		}
		if len(nodes) < params.Limit {
			return s.withGateways(ctx, out), nil
		}
		params.Cursor = nodes[len(nodes)-1].ID
		if time.Now().After(deadline) {
			return nil, &Error{Code: apiv1.CodeUnavailable, Message: "GPU filter scan took too long; narrow it with pool or state"}
		}
	}
}

func (s *Server) withGateways(ctx context.Context, out *apiv1.ListNodesResponse) *apiv1.ListNodesResponse {
	for _, n := range out.Nodes {
		n.GatewayId = s.gatewayOf(ctx, n.Id)
	}
	return out
}

// gpuMatch applies the GPU filters of nodes.list.
func gpuMatch(n *apiv1.Node, r *apiv1.ListNodesRequest) bool {
	model := strings.ToLower(r.GetGpuModel())
	count := 0
	health := false
	for _, g := range n.Gpus {
		if model != "" && !strings.Contains(strings.ToLower(g.Name), model) {
			continue
		}
		count++
		if r.GetGpuHealth() != "" && g.Health == r.GetGpuHealth() {
			health = true
		}
	}
	if model != "" && count == 0 {
		return false
	}
	if r.GetMinGpus() > 0 && count < int(r.GetMinGpus()) {
		return false
	}
	if r.GetGpuHealth() != "" && !health {
		return false
	}
	return true
}

// fleetSummary counts the nodes and GPUs of the caller's subtree's pools
// (every pool's for a root caller).
func (s *Server) fleetSummary(ctx context.Context, p *iam.Principal, _ *apiv1.FleetSummaryRequest) (*apiv1.FleetSummaryResponse, error) {
	out := &apiv1.FleetSummaryResponse{NodesByState: map[string]int32{}, GpusByModel: map[string]int32{}}
	lp := store.NodeListParams{ListParams: store.ListParams{Limit: store.MaxListLimit}}
	seen := s.poolsSeen(p)
	for {
		nodes, err := s.store.NodeList(ctx, &lp)
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			if ok, err := seen(ctx, n.PoolID); err != nil {
				return nil, err
			} else if !ok {
				continue
			}
			out.Nodes++
			out.NodesByState[n.State]++
			inv := inventoryOf(n)
			for _, g := range gpusOut(inv) {
				out.Gpus++
				out.GpusByModel[g.Name]++
				if g.Health != "ok" {
					out.UnhealthyGpus = append(out.UnhealthyGpus, &apiv1.UnhealthyGPU{NodeId: n.ID, Uuid: g.Uuid,
						Name: g.Name, Health: g.Health, Reasons: g.HealthReasons})
				}
			}
		}
		if len(nodes) < lp.Limit {
			return out, nil
		}
		lp.Cursor = nodes[len(nodes)-1].ID
		if err := ctx.Err(); err != nil {
			return nil, errors.Join(err)
		}
	}
}
