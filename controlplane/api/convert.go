package api

import (
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func tsp(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

func siteOut(s *store.Site) *apiv1.Site {
	return &apiv1.Site{Id: s.ID, Name: s.Name, Region: s.Region, CreateTime: ts(s.CreatedAt), TenantId: s.TenantID}
}

func poolOut(p *store.Pool) *apiv1.Pool {
	return &apiv1.Pool{Id: p.ID, Name: p.Name, SiteId: p.SiteID, CreateTime: ts(p.CreatedAt),
		DisruptionBudget: p.DisruptionBudget, RemediationConcurrency: int32(p.RemediationConcurrency), TenantId: p.TenantID}
}

func joinTokenOut(t *store.JoinToken) *apiv1.JoinToken {
	return &apiv1.JoinToken{Id: t.ID, PoolId: t.PoolID, Description: t.Description, MaxUses: int32(t.MaxUses),
		Uses: int32(t.Uses), ExpireTime: ts(t.ExpiresAt), RevokeTime: tsp(t.RevokedAt), CreateTime: ts(t.CreatedAt), NodeId: t.NodeID,
		State: joinTokenState(t, time.Now())}
}

// joinTokenState says whether a join token can still admit a join at now:
// active, revoked, expired or "used up".
func joinTokenState(t *store.JoinToken, now time.Time) string {
	switch {
	case t.RevokedAt != nil:
		return "revoked"
	case !t.ExpiresAt.After(now):
		return "expired"
	case t.Uses >= t.MaxUses:
		return "used up"
	}
	return "active"
}

func apiTokenOut(t *store.APIToken) *apiv1.APIToken {
	return &apiv1.APIToken{Id: t.ID, Role: t.Role, Description: t.Description, AllowCidrs: t.AllowCIDRs,
		ExpireTime: tsp(t.ExpiresAt), RevokeTime: tsp(t.RevokedAt), CreateTime: ts(t.CreatedAt), TenantId: t.TenantID}
}

// inventoryOf decodes a node's stored inventory (inventory.Decode).
func inventoryOf(n *store.Node) *sessionv1.Inventory { return inventory.Decode(n.Inventory) }

// inventoryStruct is a node's stored inventory as the object Node.inventory
// carries: its protojson (the API's marshal options) as a Struct, nil when
// the node has reported none or it does not decode.
func inventoryStruct(n *store.Node) *structpb.Struct {
	inv := inventoryOf(n)
	if inv == nil {
		return nil
	}
	b, err := marshal.Marshal(inv)
	if err != nil {
		return nil
	}
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(b, st); err != nil {
		return nil
	}
	return st
}

// outputForms splits captured output into a Command's two forms: the text
// when b is valid UTF-8, else the bytes for its _base64 field.
func outputForms(b []byte) (text string, raw []byte) {
	if utf8.Valid(b) {
		return string(b), nil
	}
	return "", b
}

func gpusOut(inv *sessionv1.Inventory) []*apiv1.GPU {
	var out []*apiv1.GPU
	for _, g := range inv.GetGpus() {
		out = append(out, &apiv1.GPU{Uuid: g.GetUuid(), Name: g.GetName(), MemoryTotalBytes: g.GetMemoryTotalBytes(),
			Health: inventory.HealthName(g.GetHealth()), HealthReasons: g.GetHealth().GetReasons()})
	}
	return out
}

func nodeOut(n *store.Node, gatewayID string, withInventory bool) *apiv1.Node {
	out := &apiv1.Node{Id: n.ID, PoolId: n.PoolID, Hostname: n.Hostname, State: n.State, Cordoned: n.Cordoned,
		Labels: n.Labels, BcdVersion: n.BCDVersion, Os: n.OS, Arch: n.Arch, LastSeenTime: tsp(n.LastSeenAt),
		CertExpireTime: tsp(n.CertNotAfter), CreateTime: ts(n.CreatedAt), GatewayId: gatewayID, BootId: n.BootID}
	if inv := inventoryOf(n); inv != nil {
		out.Gpus = gpusOut(inv)
	}
	if withInventory {
		out.Inventory = inventoryStruct(n)
	}
	if n.ClockSkew != nil {
		out.ClockSkew = durationpb.New(*n.ClockSkew)
		out.ClockSkewTime = tsp(n.ClockSkewAt)
	}
	return out
}

func commandOut(c *store.Command) *apiv1.Command {
	out := &apiv1.Command{Id: c.ID, NodeId: c.NodeID, Kind: c.Kind, State: c.State, BatchId: c.BatchID,
		Error: c.Error, OutputTruncated: c.OutputTruncated, CreateTime: ts(c.CreatedAt), DeadlineTime: ts(c.DeadlineAt),
		FinishTime: tsp(c.FinishedAt), Attempt: int32(c.Attempt), CreatedBy: c.CreatedBy}
	if c.ExitCode != nil {
		code := int32(*c.ExitCode)
		out.ExitCode = &code
	}
	specOut(out, c)
	resultOut(out, c)
	return out
}
