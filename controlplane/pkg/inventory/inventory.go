// Package inventory reads the inventories nodes report (stored as the
// protojson of session.v1.Inventory in store.Node.Inventory) and owns the
// fleet's GPU health count, which the fleet page and the metrics both show.
package inventory

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Healths are the GPU health names, in the order they are shown; a GPU
// with no health reported is "ok".
var Healths = []string{"ok", "degraded", "failed"}

// Decode decodes a stored inventory; nil when there is none or it does not
// decode (a node of a newer bcd may send fields this build does not know:
// those are dropped).
func Decode(b []byte) *sessionv1.Inventory {
	if len(b) == 0 {
		return nil
	}
	inv := &sessionv1.Inventory{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, inv); err != nil {
		return nil
	}
	return inv
}

// HealthName turns GPU_HEALTH_STATE_FAILED into "failed"; an unset health
// is "ok".
func HealthName(h *sessionv1.GPUHealth) string {
	if h == nil || h.GetState() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_UNSPECIFIED {
		return "ok"
	}
	return strings.ToLower(strings.TrimPrefix(h.GetState().String(), "GPU_HEALTH_STATE_"))
}

// NodeLister is the store read CountGPUs needs.
type NodeLister interface {
	NodeList(ctx context.Context, p *store.NodeListParams) ([]*store.Node, error)
}

// CountGPUs counts the GPUs of every node's last inventory by health name
// (HealthName). It reads every node, in pages of store.MaxListLimit: O(nodes),
// so callers keep the answer for a while (metrics and the fleet page: 5 s).
func CountGPUs(ctx context.Context, st NodeLister) (map[string]int, error) {
	counts := map[string]int{}
	lp := store.NodeListParams{ListParams: store.ListParams{Limit: store.MaxListLimit}}
	for {
		nodes, err := st.NodeList(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("count GPUs: %w", err)
		}
		for _, n := range nodes {
			for _, g := range Decode(n.Inventory).GetGpus() {
				counts[HealthName(g.GetHealth())]++
			}
		}
		if len(nodes) < lp.Limit {
			return counts, nil
		}
		lp.Cursor = nodes[len(nodes)-1].ID
	}
}
