// Package gputest provides go-nvml mocks ready for tests of code that reads
// GPUs through package gpu (bcd/inventory/gpu) or builds on it (bcd/agent):
// the mock DGX A100 with stable ids and "not supported" answers for every
// query the mock leaves unset, and an event set that tests feed XID and ECC
// events into.
//
// It is test code; production code never imports it.
package gputest

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
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

// Readings are settable counter readings of one mock GPU, safe to change
// while a Collector reads them: ECC counts, row remapping, clock event
// reasons, the NVLink replay total and the driver's recovery action (NVML
// field values), retired pages pending, and a lost GPU. WireReadings makes
// a device answer from them.
type Readings struct {
	mu                   sync.Mutex
	eccCorrected         uint64
	eccUncorrected       uint64
	remapPending         bool
	remapFailure         bool
	clocks               uint64
	nvlinkReplay         uint64
	recovery             uint64
	retiredPagesPending  bool
	lost                 bool
	remapUncorrectedRows int
	pcieReplays          uint64
	pcieWidth            int
	fabricState          uint8
	persistenceOff       bool
}

// Set changes the readings under their lock.
func (r *Readings) Set(fn func(*ReadingValues)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := ReadingValues{ECCCorrected: r.eccCorrected, ECCUncorrected: r.eccUncorrected, RemapPending: r.remapPending,
		RemapFailure: r.remapFailure, RemapUncorrectedRows: r.remapUncorrectedRows, ClocksEventReasons: r.clocks,
		NVLinkReplay: r.nvlinkReplay, RecoveryAction: r.recovery, RetiredPagesPending: r.retiredPagesPending, Lost: r.lost,
		PCIeReplays: r.pcieReplays, PCIeWidth: r.pcieWidth, FabricState: r.fabricState, PersistenceOff: r.persistenceOff}
	fn(&v)
	r.persistenceOff = v.PersistenceOff
	r.pcieReplays, r.pcieWidth, r.fabricState = v.PCIeReplays, v.PCIeWidth, v.FabricState
	r.eccCorrected, r.eccUncorrected, r.remapPending, r.remapFailure = v.ECCCorrected, v.ECCUncorrected, v.RemapPending, v.RemapFailure
	r.remapUncorrectedRows, r.clocks, r.nvlinkReplay, r.recovery = v.RemapUncorrectedRows, v.ClocksEventReasons, v.NVLinkReplay, v.RecoveryAction
	r.retiredPagesPending, r.lost = v.RetiredPagesPending, v.Lost
}

// ReadingValues are the values Readings.Set changes.
type ReadingValues struct {
	ECCCorrected, ECCUncorrected uint64 // volatile counts
	RemapPending, RemapFailure   bool
	RemapUncorrectedRows         int
	ClocksEventReasons           uint64 // nvmlClocksEventReason* bits
	NVLinkReplay                 uint64 // FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL (other NVLink totals 0)
	RecoveryAction               uint64 // nvml.DeviceGpuRecoveryAction
	RetiredPagesPending          bool
	Lost                         bool // the temperature query answers ERROR_GPU_IS_LOST
	PCIeReplays                  uint64
	PCIeWidth                    int   // the link's current width; 0 is its maximum, 16
	FabricState                  uint8 // nvml.GPU_FABRIC_STATE_*; 0 (NOT_SUPPORTED) is COMPLETED with SUCCESS
	PersistenceOff               bool  // persistence mode reads disabled (on by default)
}

// The PCIe link WireReadings gives every GPU at most: generation 4, 16
// lanes (an A100 SXM4's).
const (
	PCIeMaxGeneration = 4
	PCIeMaxWidth      = 16
)

// WireReadings makes device d answer its ECC, row remapping, clock event
// reason, field value (NVLink totals, recovery action), retired pages,
// PCIe (replay counter, link width; generation 4 of 4, width of 16), GPU
// fabric (completed unless set), persistence mode (on unless set) and
// temperature queries from a new Readings, all zero (supported, nothing
// wrong), and its board serial query with Serial(its UUID); it returns the
// Readings.
func WireReadings(d *dgxa100.Device) *Readings {
	r := &Readings{}
	serial := Serial(d.UUID)
	d.GetSerialFunc = func() (string, nvml.Return) { return serial, nvml.SUCCESS }
	d.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, ctr nvml.EccCounterType) (uint64, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if ctr != nvml.VOLATILE_ECC {
			return 0, nvml.SUCCESS
		}
		if typ == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			return r.eccUncorrected, nvml.SUCCESS
		}
		return r.eccCorrected, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return 0, r.remapUncorrectedRows, r.remapPending, r.remapFailure, nvml.SUCCESS
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.clocks, nvml.SUCCESS
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.retiredPagesPending {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.lost {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return 40, nvml.SUCCESS
	}
	fixed := func(v int) func() (int, nvml.Return) { return func() (int, nvml.Return) { return v, nvml.SUCCESS } }
	d.GetCurrPcieLinkGenerationFunc = fixed(PCIeMaxGeneration)
	d.GetMaxPcieLinkGenerationFunc = fixed(PCIeMaxGeneration)
	d.GetMaxPcieLinkWidthFunc = fixed(PCIeMaxWidth)
	d.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return cmp.Or(r.pcieWidth, PCIeMaxWidth), nvml.SUCCESS
	}
	d.GetPcieReplayCounterFunc = func() (int, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return int(min(r.pcieReplays, math.MaxInt32)), nvml.SUCCESS
	}
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		st := r.fabricState
		if st == nvml.GPU_FABRIC_STATE_NOT_SUPPORTED {
			st = nvml.GPU_FABRIC_STATE_COMPLETED
		}
		return nvml.GpuFabricInfo{State: st, Status: uint32(nvml.SUCCESS)}, nvml.SUCCESS
	}
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.persistenceOff {
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i := range vals {
			var v uint64
			typ := nvml.VALUE_TYPE_UNSIGNED_LONG_LONG
			switch vals[i].FieldId {
			case nvml.FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
				v = r.nvlinkReplay
			case nvml.FI_DEV_GET_GPU_RECOVERY_ACTION:
				v, typ = r.recovery, nvml.VALUE_TYPE_UNSIGNED_INT
			case nvml.FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, nvml.FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
				nvml.FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
			default:
				vals[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				continue
			}
			vals[i].NvmlReturn, vals[i].ValueType = uint32(nvml.SUCCESS), uint32(typ)
			binary.LittleEndian.PutUint64(vals[i].Value[:], v)
		}
		return nvml.SUCCESS
	}
	return r
}

// ECCEvent returns the event NVML delivers when device d reports a
// double-bit (uncorrectable) ECC error.
func ECCEvent(d nvml.Device) nvml.EventData {
	return nvml.EventData{Device: d, EventType: nvml.EventTypeDoubleBitEccError}
}

// Serial is the board serial WireReadings gives the GPU of UUID uuid: "1320"
// and the UUID's last 9 digits.
func Serial(uuid string) string {
	return "1320" + uuid[max(len(uuid)-9, 0):]
}

// Outputs of `systemctl show nvidia-fabricmanager.service
// --property=ActiveState,SubState,LoadState,NRestarts,ActiveEnterTimestampMonotonic`
// as systemd 252 prints them (service properties first, then the unit's),
// for a FabricManager runner: the unit running, failed, restarting after a
// crash, and not installed.
const (
	FabricManagerRunning     = "NRestarts=0\nActiveEnterTimestampMonotonic=8123456\nLoadState=loaded\nActiveState=active\nSubState=running\n"
	FabricManagerFailed      = "NRestarts=0\nActiveEnterTimestampMonotonic=8123456\nLoadState=loaded\nActiveState=failed\nSubState=failed\n"
	FabricManagerAutoRestart = "NRestarts=1\nActiveEnterTimestampMonotonic=8123456\nLoadState=loaded\nActiveState=activating\nSubState=auto-restart\n"
	FabricManagerNotFound    = "NRestarts=0\nActiveEnterTimestampMonotonic=0\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n"
)

// FabricManager stands in for systemctl (gpu.Config.Runner): it answers
// `systemctl show` with the output last Set, FabricManagerRunning at
// first, and records how often it was asked.
type FabricManager struct {
	mu    sync.Mutex
	out   string
	err   error
	calls int
}

// NewFabricManager returns a FabricManager answering FabricManagerRunning.
func NewFabricManager() *FabricManager { return &FabricManager{out: FabricManagerRunning} }

// Set makes later calls answer out.
func (f *FabricManager) Set(out string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.out, f.err = out, nil
}

// Restart makes later calls answer the unit running after n more automatic
// restarts than the output last Set (its NRestarts plus n, a new
// ActiveEnterTimestampMonotonic).
func (f *FabricManager) Restart(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var restarts, enter uint64
	for _, l := range strings.Split(f.out, "\n") {
		if v, ok := strings.CutPrefix(l, "NRestarts="); ok {
			fmt.Sscan(v, &restarts)
		}
		if v, ok := strings.CutPrefix(l, "ActiveEnterTimestampMonotonic="); ok {
			fmt.Sscan(v, &enter)
		}
	}
	f.out = fmt.Sprintf("NRestarts=%d\nActiveEnterTimestampMonotonic=%d\nLoadState=loaded\nActiveState=active\nSubState=running\n",
		restarts+uint64(n), enter+uint64(n)*1_000_000)
}

// Fail makes later calls fail with err (systemctl missing, no systemd).
func (f *FabricManager) Fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// Calls is how many times systemctl was run.
func (f *FabricManager) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// Output answers `systemctl show ...`; any other command is an error.
func (f *FabricManager) Output(_ context.Context, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if name != "systemctl" || len(args) == 0 || args[0] != "show" {
		return nil, fmt.Errorf("fake systemctl: unexpected command %s %v", name, args)
	}
	if f.err != nil {
		return nil, f.err
	}
	return []byte(f.out), nil
}
