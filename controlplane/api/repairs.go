package api

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Repairs on order (docs/remediation.md, "Repairs on order"): an operator's
// gpu.reset or reboot of a node is a remediation case opened in state
// draining, its node admitted against the pool's disruption budget and
// cordoned in the same transaction. The remediation reconciler carries it
// out from there exactly as its own actions (one command under the
// idempotency key remediation:<case>:<attempt>, the same verification),
// and the case is the node's and the GPU's history (remediation list
// --node N). The breaker does not count it: it is not automatic.

// The kind and finding of a case an operator ordered.
const (
	kindOrdered    = "operator.order"
	findingOrdered = "operator"
)

// nodesGPUReset orders a reset of one of a node's GPUs.
func (s *Server) nodesGPUReset(ctx context.Context, p *iam.Principal, r *apiv1.NodeGPUResetRequest) (*apiv1.NodeRepairResponse, error) {
	n, err := s.node(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	if err := checkNote(r.GetNote()); err != nil {
		return nil, err
	}
	uuid, err := gpuOf(n, r.GetGpu())
	if err != nil {
		return nil, err
	}
	return s.order(ctx, p, n, config.ActionGPUReset, uuid, r.GetNote())
}

// nodesReboot orders a reboot of a node.
func (s *Server) nodesReboot(ctx context.Context, p *iam.Principal, r *apiv1.NodeRepairRequest) (*apiv1.NodeRepairResponse, error) {
	n, err := s.node(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	if err := checkNote(r.GetNote()); err != nil {
		return nil, err
	}
	return s.order(ctx, p, n, config.ActionReboot, "", r.GetNote())
}

func checkNote(note string) error {
	if len(note) > MaxRemediationNote || !utf8.ValidString(note) {
		return invalid("note", "must be at most %d characters of UTF-8", MaxRemediationNote)
	}
	return nil
}

// gpuOf resolves a GPU given by UUID or index among node n's inventory
// GPUs.
func gpuOf(n *store.Node, gpu string) (string, error) {
	if gpu == "" {
		return "", invalid("gpu", "is required: a GPU's UUID (GPU-...) or its index on the node")
	}
	gpus := inventoryOf(n).GetGpus()
	if i, err := strconv.Atoi(gpu); err == nil {
		if i < 0 || i >= len(gpus) {
			return "", invalid("gpu", "node %s has %d GPUs: index %d is not one of them", n.ID, len(gpus), i)
		}
		return gpus[i].GetUuid(), nil
	}
	for _, g := range gpus {
		if g.GetUuid() == gpu {
			return gpu, nil
		}
	}
	if len(gpu) > 128 {
		gpu = gpu[:128]
	}
	return "", &Error{Code: apiv1.CodeNotFound, Field: "gpu", Message: fmt.Sprintf("node %s has no GPU %q (nodes get %s lists them)", n.ID, gpu, n.ID)}
}

// order opens the case of an ordered repair, admitted against the pool's
// disruption budget.
func (s *Server) order(ctx context.Context, p *iam.Principal, n *store.Node, action, uuid, note string) (*apiv1.NodeRepairResponse, error) {
	actor := "token:" + p.TokenID
	var out *store.Remediation
	err := store.InTx(ctx, s.store, func(tx orderTx) error {
		switch open, err := tx.RemediationOpenFor(ctx, n.ID); {
		case err == nil:
			return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("node %s has open remediation %s (%s): "+
				"return it with a repair instead (better-compute remediation return %s --reset-gpu or --reboot)", n.ID, open.ID, open.State, open.ID)}
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		reason := fmt.Sprintf("ordered by %s: %s", actor, action)
		if uuid != "" {
			reason += " of GPU " + uuid
		}
		if note != "" {
			reason += ": " + note
		}
		c, err := tx.RemediationCreate(ctx, &store.Remediation{NodeID: n.ID, State: store.RemediationDraining,
			Finding: findingOrdered, Kind: kindOrdered, GPUUUID: uuid, Message: reason, Reason: reason, Action: action}, actor)
		if err != nil {
			return err
		}
		if err := admitOrdered(ctx, tx, c); err != nil {
			return err
		}
		out = c
		return tx.NodeSetCordoned(ctx, n.ID, true)
	})
	if err != nil {
		return nil, err
	}
	return &apiv1.NodeRepairResponse{RemediationId: out.ID, NodeId: out.NodeID, Action: out.Action, GpuUuid: out.GPUUUID,
		State: out.State}, nil
}

// admitOrdered takes the disruption hold of ordered case c (reason
// draining, owner remediation:<case>): CONFLICT, naming the count, when the
// pool's budget is full or another owner holds the node.
func admitOrdered(ctx context.Context, tx admitTx, c *store.Remediation) error {
	a, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: c.NodeID, Reason: store.DisruptionDraining,
		Owner: store.RemediationOwner(c.ID)})
	if err != nil {
		return err
	}
	switch a.Refusal {
	case "":
		return nil
	case store.RefusalBudget:
		return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("pool %s has %d of its %d nodes out of service, its disruption budget "+
			"(%s: %d): %s refused; wait for one to come back, or raise it (better-compute pools set-budget)", a.Budget.PoolID,
			a.Budget.OutOfService, a.Budget.Nodes, a.Budget.Spec, a.Budget.Budget, c.Action)}
	case store.RefusalHeld:
		return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("node %s is out of service already, held by %s: %s refused",
			c.NodeID, a.Holder, c.Action)}
	default:
		return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("%s of node %s refused: %s", c.Action, c.NodeID, a.Refusal)}
	}
}

// unhealthyGPU returns the UUID and health ("failed", "degraded") of the
// first GPU of node n that reads failed or degraded, only GPU only when it
// is not ""; "" when none does.
func unhealthyGPU(n *store.Node, only string) (uuid, health string) {
	for _, g := range inventoryOf(n).GetGpus() {
		if only != "" && g.GetUuid() != only {
			continue
		}
		switch g.GetHealth().GetState() {
		case sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED, sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED:
			return g.GetUuid(), strings.ToLower(strings.TrimPrefix(g.GetHealth().GetState().String(), "GPU_HEALTH_STATE_"))
		}
	}
	return "", ""
}
