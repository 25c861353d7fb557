package gpu_test

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// newDGXA100 returns go-nvml's mock DGX A100 with stable UUIDs and PCI bus
// ids, and every method the mock leaves unset answering
// ERROR_NOT_SUPPORTED (the moq mocks panic on unset methods, a real driver
// answers "not supported").
func newDGXA100() *dgxa100.Server {
	s := dgxa100.New()
	notSupported(s)
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.UUID = stableUUID(i)
		notSupported(dev)
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

func stableUUID(i int) string {
	return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i)
}

// notSupported sets every nil XxxFunc field of the mock behind ptr
// (including embedded mocks) to a function returning zero values and
// ERROR_NOT_SUPPORTED for each nvml.Return result.
func notSupported(ptr any) {
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

// fakeEvents is an nvml.EventSet whose Wait returns queued events and
// otherwise blocks for its timeout, like NVML's.
type fakeEvents struct {
	mock.EventSet
	ch chan nvml.EventData
}

func newFakeEvents() *fakeEvents {
	f := &fakeEvents{ch: make(chan nvml.EventData, 16)}
	notSupported(&f.EventSet)
	f.FreeFunc = func() nvml.Return { return nvml.SUCCESS }
	f.WaitFunc = func(ms uint32) (nvml.EventData, nvml.Return) {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case ev := <-f.ch:
			return ev, nvml.SUCCESS
		case <-t.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
	return f
}

// wireEvents makes s hand out set and makes every device support and
// accept the watched event types. It returns a channel that receives each
// device's registered mask.
func wireEvents(s *dgxa100.Server, set *fakeEvents) chan uint64 {
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
