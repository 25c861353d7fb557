// Package gputest provides go-nvml mocks ready for tests of code that reads
// GPUs through package gpu (bcd/inventory/gpu) or builds on it (bcd/agent):
// the mock DGX A100 with stable ids and "not supported" answers for every
// query the mock leaves unset, and an event set that tests feed XID and ECC
// events into.
//
// It is test code; production code never imports it.
package gputest

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// NewDGXA100 returns go-nvml's mock DGX A100 (8 × A100-SXM4-40GB) with
// stable UUIDs (see UUID) and PCI bus ids, and every method the mock leaves
// unset answering ERROR_NOT_SUPPORTED (the moq mocks panic on unset methods,
// a real driver answers "not supported").
func NewDGXA100() *dgxa100.Server {
	s := dgxa100.New()
	NotSupported(s)
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.UUID = UUID(i)
		NotSupported(dev)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			p := nvml.PciInfo{PciDeviceId: dev.Config.PciDeviceId}
			for j, c := range "0000000" + dev.PciBusID {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
	}
	return s
}

// UUID is the UUID NewDGXA100 gives GPU i, for example
// "GPU-00000000-0000-0000-0000-000000000003" for i = 3.
func UUID(i int) string {
	return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i)
}

// NotSupported sets every nil XxxFunc field of the mock behind ptr
// (including embedded mocks) to a function returning zero values and
// ERROR_NOT_SUPPORTED for each nvml.Return result.
func NotSupported(ptr any) {
	fill(reflect.ValueOf(ptr).Elem())
}

var returnType = reflect.TypeFor[nvml.Return]()

func fill(v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f, sf := v.Field(i), t.Field(i)
		switch {
		case sf.Anonymous && f.Kind() == reflect.Struct && f.CanSet():
			fill(f)
		case f.Kind() == reflect.Func && f.CanSet() && f.IsNil() && strings.HasSuffix(sf.Name, "Func"):
			ft := f.Type()
			f.Set(reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
				out := make([]reflect.Value, ft.NumOut())
				for j := range out {
					out[j] = reflect.Zero(ft.Out(j))
					if ft.Out(j) == returnType {
						out[j] = reflect.ValueOf(nvml.ERROR_NOT_SUPPORTED)
					}
				}
				return out
			}))
		}
	}
}

// EventSet is an nvml.EventSet whose Wait returns the events sent on C and
// otherwise blocks for its timeout and answers ERROR_TIMEOUT, like NVML's.
type EventSet struct {
	mock.EventSet
	// C takes the events Wait returns, in order (buffered: 16).
	C chan nvml.EventData
}

// NewEventSet returns an EventSet with Free answering SUCCESS.
func NewEventSet() *EventSet {
	f := &EventSet{C: make(chan nvml.EventData, 16)}
	NotSupported(&f.EventSet)
	f.FreeFunc = func() nvml.Return { return nvml.SUCCESS }
	f.WaitFunc = func(ms uint32) (nvml.EventData, nvml.Return) {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case ev := <-f.C:
			return ev, nvml.SUCCESS
		case <-t.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
	return f
}

// WireEvents makes s hand out set from EventSetCreate and makes every
// device support and accept XID, double- and single-bit ECC and P-state
// events. It returns a channel (buffered for every device) that receives
// the mask each device registers.
func WireEvents(s *dgxa100.Server, set *EventSet) chan uint64 {
	registered := make(chan uint64, len(s.Devices))
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	for _, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError |
				nvml.EventTypeSingleBitEccError | nvml.EventTypePState, nvml.SUCCESS
		}
		dev.RegisterEventsFunc = func(mask uint64, es nvml.EventSet) nvml.Return {
			if es != set {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			registered <- mask
			return nvml.SUCCESS
		}
	}
	return registered
}

// XID returns the event NVML delivers when device d reports XID xid.
func XID(d nvml.Device, xid uint64) nvml.EventData {
	return nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xid}
}
