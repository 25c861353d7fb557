package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// labelsSummary is a node's labels as "k=v, k2=v2" sorted by key, or "-".
func labelsSummary(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		kv = append(kv, k+"="+labels[k])
	}
	return strings.Join(kv, ", ")
}

// inventoryRows are the table rows summarising a node's inventory (the
// Node.inventory object, the protojson of a session Inventory): cpu,
// memory, gpus by model, os and kernel, and when it was collected. A node
// that has reported none gets one row saying so.
func inventoryRows(n *apiv1.Node) [][]string {
	inv := decodeInventory(n.GetInventory())
	if inv == nil {
		return [][]string{{"inventory", "none reported yet"}}
	}
	h := inv.GetHost()
	cpu := "-"
	if c := h.GetCpu(); c != nil {
		cpu = fmt.Sprintf("%s (%d sockets, %d cores, %d threads)", orDash(c.GetModel()), c.GetSockets(), c.GetCores(), c.GetThreads())
	}
	mem := "-"
	if b := h.GetMemory().GetTotalBytes(); b > 0 {
		mem = fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	gpus := gpusByModel(inv.GetGpus())
	if gpus == "-" && inv.GetGpuStatus() != "" {
		gpus = "none read: " + inv.GetGpuStatus()
	}
	osName := strings.TrimSpace(h.GetOs().GetName() + " " + h.GetOs().GetVersion())
	rows := [][]string{
		{"cpu", cpu},
		{"memory", mem},
		{"gpus", gpus},
		{"os", orDash(osName)},
		{"kernel", orDash(h.GetOs().GetKernel())},
		{"inventory collected", when(inv.GetCollectedAt())},
	}
	for _, p := range inv.GetIbPorts() {
		rows = append(rows, []string{fmt.Sprintf("ib %s/%d", p.GetDevice(), p.GetPort()), ibPortSummary(p)})
	}
	return rows
}

// ibPortSummary is one line of an InfiniBand/RoCE port: "ACTIVE/LinkUp 400
// Gb/sec (4X NDR) InfiniBand, errors: symbol 0, rcv 0, recovery 0,
// overrun 0, link downed 0; ok", its health's reasons after it.
func ibPortSummary(p *sessionv1.InfiniBandPort) string {
	health := strings.ToLower(strings.TrimPrefix(p.GetHealth().GetState().String(), "GPU_HEALTH_STATE_"))
	if rs := p.GetHealth().GetReasons(); len(rs) > 0 {
		health += " (" + strings.Join(rs, "; ") + ")"
	}
	return fmt.Sprintf("%s/%s %s %s, errors: symbol %d, rcv %d, recovery %d, overrun %d, link downed %d; %s",
		orDash(p.GetState()), orDash(p.GetPhysState()), orDash(p.GetRate()), orDash(p.GetLinkLayer()), p.GetSymbolError(),
		p.GetPortRcvErrors(), p.GetLinkErrorRecovery(), p.GetExcessiveBufferOverrunErrors(), p.GetLinkDowned(), health)
}

// gpusByModel counts GPUs by product name: "8x NVIDIA H100 80GB HBM3 (80
// GiB)", several models comma-separated in name order; "-" when none.
func gpusByModel(gpus []*sessionv1.GPU) string {
	type model struct {
		n   int
		mem uint64
	}
	by := map[string]*model{}
	for _, g := range gpus {
		m := by[g.GetName()]
		if m == nil {
			m = &model{mem: g.GetMemoryTotalBytes()}
			by[g.GetName()] = m
		}
		m.n++
	}
	if len(by) == 0 {
		return "-"
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%dx %s (%d GiB)", by[name].n, orDash(name), by[name].mem>>30))
	}
	return strings.Join(parts, ", ")
}

// decodeInventory reads the inventory object back into its session form;
// nil when absent or when it does not decode.
func decodeInventory(st *structpb.Struct) *sessionv1.Inventory {
	if st == nil {
		return nil
	}
	b, err := protojson.Marshal(st)
	if err != nil {
		return nil
	}
	inv := &sessionv1.Inventory{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, inv); err != nil {
		return nil
	}
	return inv
}
