// Package gpucount keeps a node's expected GPU count and judges an
// inventory against it (docs/gpu-health.md, "GPU count"): a GPU that falls
// off the bus vanishes from NVML, and the node's inventory just lists one
// fewer, so the control plane remembers how many there should be.
//
// The expected count is the node's label Label: set from the node's first
// full inventory (NVML answered and listed at least one GPU) when the
// label is not there yet, given at join (nodes add --label), or changed by
// an operator with nodes.setGPUCount for an intended change (a board sent
// for repair). An inventory listing fewer GPUs than expected gives one
// finding per missing GPU, named from the GPUs bcd has seen on the machine
// (Inventory.gpus_seen): signal gpu_missing, RESTART_BM (a GPU off the bus
// comes back, if at all, with a restart of the machine), health failed.
package gpucount

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Label is the node label that holds the expected GPU count, in decimal.
const Label = "better-compute.io/gpu-count"

// Max is the largest expected count accepted (a label or setGPUCount).
const Max = 64

// Resolution is what a missing GPU calls for (NVIDIA's word for a restart
// of the machine; XID 79, "GPU has fallen off the bus", calls for the same).
const Resolution = "RESTART_BM"

// Expected reads the expected count from a node's labels; ok is false when
// the label is absent or not a count from 0 to Max.
func Expected(labels map[string]string) (n int, ok bool) {
	v, found := labels[Label]
	if !found {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > Max {
		return 0, false
	}
	return n, true
}

// Full reports whether inv is a full inventory, the one an expected count
// may be taken from: NVML answered (no gpu_status) and listed GPUs.
func Full(inv *sessionv1.Inventory) bool {
	return inv.GetGpuStatus() == "" && len(inv.GetGpus()) > 0
}

// Missing returns the findings of inv against expected GPUs, observed at
// now: none when inv lists as many or more (or is not a full inventory:
// with no driver or NVML unreadable, the other readers speak); otherwise
// one per GPU bcd has seen that inv does not list, or a single one naming
// no GPU when bcd's record does not say which is missing.
func Missing(inv *sessionv1.Inventory, expected int, now time.Time) []*sessionv1.GPUFinding {
	present := len(inv.GetGpus())
	if !Full(inv) || present >= expected {
		return nil
	}
	listed := make([]string, 0, present)
	for _, g := range inv.GetGpus() {
		listed = append(listed, g.GetUuid())
	}
	var gone []string
	for _, u := range inv.GetGpusSeen() {
		if u != "" && !slices.Contains(listed, u) && !slices.Contains(gone, u) {
			gone = append(gone, u)
		}
	}
	if len(gone) == 0 {
		gone = []string{""}
	}
	out := make([]*sessionv1.GPUFinding, 0, len(gone))
	for _, u := range gone {
		name := u
		if name == "" {
			name = "a GPU bcd has no record of"
		}
		out = append(out, &sessionv1.GPUFinding{
			GpuUuid: u,
			Signal: &sessionv1.GPUFinding_GpuMissing{GpuMissing: &sessionv1.GPUMissingSignal{
				Expected: uint32(expected), Present: uint32(present)}},
			ImmediateResolution: Resolution, Resolution: Resolution,
			Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED,
			Evidence: &sessionv1.GPUFindingEvidence{Source: "inventory",
				Counters: map[string]uint64{"gpusExpected": uint64(expected), "gpusPresent": uint64(present)},
				Message:  fmt.Sprintf("%d of %d expected GPUs present; missing %s", present, expected, name)},
			ObservedAt: timestamppb.New(now),
		})
	}
	return out
}
