package sim_test

import (
	"errors"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/sim"
)

// TestSwapGPU: each simulated machine's GPUs have UUIDs unique per node;
// a board swapped into a slot is listed there with its UUID and serial,
// and the inventory's digest changes with it.
func TestSwapGPU(t *testing.T) {
	a, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "swap-a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "swap-b"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range []*sim.FakeDaemon{a, b} {
		for _, g := range d.Inventory().GetGpus() {
			if seen[g.GetUuid()] {
				t.Fatalf("UUID %s on two simulated GPUs", g.GetUuid())
			}
			seen[g.GetUuid()] = true
		}
	}
	before := b.CurrentInventory().GetDigest()
	moved := a.Inventory().GetGpus()[3]
	if err := b.SwapGPU(1, moved.GetUuid(), moved.GetSerial()); err != nil {
		t.Fatal(err)
	}
	inv := b.CurrentInventory()
	if g := inv.GetGpus()[1]; g.GetUuid() != moved.GetUuid() || g.GetSerial() != moved.GetSerial() || inv.GetDigest() == before {
		t.Fatalf("after the swap GPU 1 = %s (%s), digest changed %v", g.GetUuid(), g.GetSerial(), inv.GetDigest() != before)
	}
	if b.Inventory().GetGpus()[1].GetUuid() == moved.GetUuid() {
		t.Fatal("the swap changed the machine's own inventory")
	}
	if err := b.SwapGPU(8, "GPU-x", ""); !errors.Is(err, sim.ErrNoSuchGPU) {
		t.Fatalf("swap into slot 8: %v, want ErrNoSuchGPU", err)
	}
	if err := b.SwapGPU(0, "", ""); !errors.Is(err, sim.ErrBadFault) {
		t.Fatalf("swap without a UUID: %v, want ErrBadFault", err)
	}
}
