package gpu_test

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
)

// The mocks live in gputest, shared with the agent's tests; these short
// names keep this package's tests readable.

func newDGXA100() *dgxa100.Server { return gputest.NewDGXA100() }

func stableUUID(i int) string { return gputest.UUID(i) }

func notSupported(ptr any) { gputest.NotSupported(ptr) }

type fakeEvents = gputest.EventSet

func newFakeEvents() *fakeEvents { return gputest.NewEventSet() }

func wireEvents(s *dgxa100.Server, set *fakeEvents) chan uint64 { return gputest.WireEvents(s, set) }

func xidEvent(d nvml.Device, xid uint64) nvml.EventData { return gputest.XID(d, xid) }
