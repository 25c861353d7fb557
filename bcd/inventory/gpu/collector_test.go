package gpu_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
)

// recorder is a slog.Handler that keeps every record and also writes it to
// the test log.
type recorder struct {
	next slog.Handler
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newRecorder(t *testing.T) recorder {
	return recorder{
		next: slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}),
		mu:   new(sync.Mutex),
		recs: new([]slog.Record),
	}
}

func (r recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r recorder) Handle(ctx context.Context, rec slog.Record) error {
	r.mu.Lock()
	*r.recs = append(*r.recs, rec.Clone())
	r.mu.Unlock()
	return r.next.Handle(ctx, rec)
}
func (r recorder) WithAttrs(as []slog.Attr) slog.Handler {
	r.next = r.next.WithAttrs(as)
	return r
}
func (r recorder) WithGroup(g string) slog.Handler {
	r.next = r.next.WithGroup(g)
	return r
}

// count returns how many records have level and message msg.
func (r recorder) count(level slog.Level, msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range *r.recs {
		if rec.Level == level && rec.Message == msg {
			n++
		}
	}
	return n
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newCollector(t *testing.T, cfg gpu.Config) *gpu.Collector {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if cfg.Runner == nil {
		cfg.Runner = gputest.NewFabricManager() // not the host's systemd
	}
	c, err := gpu.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func collect(t *testing.T, c *gpu.Collector) gpu.Report {
	t.Helper()
	rep, err := c.Collect(t.Context())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return rep
}

func device(s *dgxa100.Server, i int) *dgxa100.Device { return s.Devices[i].(*dgxa100.Device) }

func TestCollectDGXA100(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	rep := collect(t, newCollector(t, gpu.Config{NVML: s}))

	if rep.Status != "" || !rep.NVML {
		t.Errorf("Status = %q, NVML = %v, want empty and true", rep.Status, rep.NVML)
	}
	if len(rep.GPUs) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(rep.GPUs))
	}
	for i, g := range rep.GPUs {
		d := device(s, i)
		if g.Index != i {
			t.Errorf("GPU %d: Index = %d", i, g.Index)
		}
		if !strings.Contains(g.Name, "A100") {
			t.Errorf("GPU %d: Name = %q, want it to contain A100", i, g.Name)
		}
		if g.UUID != stableUUID(i) {
			t.Errorf("GPU %d: UUID = %q, want %q", i, g.UUID, stableUUID(i))
		}
		if g.MemoryTotalBytes != d.MemoryInfo.Total || g.MemoryTotalBytes != 40960<<20 {
			t.Errorf("GPU %d: MemoryTotalBytes = %d, want %d (40 GiB)", i, g.MemoryTotalBytes, d.MemoryInfo.Total)
		}
		if want := "0000000" + d.PciBusID; g.PCIBusID != want {
			t.Errorf("GPU %d: PCIBusID = %q, want %q", i, g.PCIBusID, want)
		}
		if g.DriverVersion != "550.54.15" || g.CUDADriverVersion != "12.4" {
			t.Errorf("GPU %d: driver %q cuda %q, want 550.54.15 and 12.4", i, g.DriverVersion, g.CUDADriverVersion)
		}
		// The mock does not implement these: NOT_SUPPORTED leaves them empty.
		if g.Serial != "" || g.TemperatureC != 0 || g.PowerDrawMilliwatts != 0 || g.SMClockMHz != 0 ||
			g.ECC != nil || g.RetiredPages != nil || g.RemappedRows != nil {
			t.Errorf("GPU %d: unsupported fields not empty: %+v", i, g)
		}
		if g.MIG == nil || g.MIG.Enabled {
			t.Errorf("GPU %d: MIG = %+v, want present and disabled", i, g.MIG)
		}
		if len(g.Errors) != 0 {
			t.Errorf("GPU %d: Errors = %q, want none", i, g.Errors)
		}
		if g.Health != gpu.HealthOK || len(g.HealthReasons) != 0 {
			t.Errorf("GPU %d: health %s %q, want ok", i, g.Health, g.HealthReasons)
		}
	}
}

func TestCollectReadingsAndHealth(t *testing.T) {
	t.Parallel()
	s := newDGXA100()

	d := device(s, 1) // healthy, every reading supported
	d.GetSerialFunc = func() (string, nvml.Return) { return "1564720004631", nvml.SUCCESS }
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 41, nvml.SUCCESS }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 61_234, nvml.SUCCESS }
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 400_000, nvml.SUCCESS }
	d.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		return map[nvml.ClockType]uint32{nvml.CLOCK_SM: 1410, nvml.CLOCK_MEM: 1215}[c], nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, ctr nvml.EccCounterType) (uint64, nvml.Return) {
		if typ == nvml.MEMORY_ERROR_TYPE_CORRECTED {
			return map[nvml.EccCounterType]uint64{nvml.VOLATILE_ECC: 3, nvml.AGGREGATE_ECC: 4}[ctr], nvml.SUCCESS
		}
		return map[nvml.EccCounterType]uint64{nvml.VOLATILE_ECC: 0, nvml.AGGREGATE_ECC: 7}[ctr], nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 2, 0, false, false, nvml.SUCCESS }

	ecc := func(unc uint64) func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
		return func(typ nvml.MemoryErrorType, ctr nvml.EccCounterType) (uint64, nvml.Return) {
			if typ == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && ctr == nvml.VOLATILE_ECC {
				return unc, nvml.SUCCESS
			}
			return 0, nvml.SUCCESS
		}
	}
	device(s, 2).GetTotalEccErrorsFunc = ecc(3)
	device(s, 3).GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 1, true, false, nvml.SUCCESS }
	device(s, 4).GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 9, true, true, nvml.SUCCESS }
	device(s, 5).GetSerialFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NO_PERMISSION }
	device(s, 6).GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	handle := s.DeviceGetHandleByIndexFunc
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 7 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return handle(i)
	}

	rep := collect(t, newCollector(t, gpu.Config{NVML: s}))
	if len(rep.GPUs) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(rep.GPUs))
	}

	g := rep.GPUs[1]
	if g.Serial != "1564720004631" || g.TemperatureC != 41 || g.PowerDrawMilliwatts != 61_234 ||
		g.PowerLimitMilliwatts != 400_000 || g.SMClockMHz != 1410 || g.MemoryClockMHz != 1215 {
		t.Errorf("GPU 1 readings wrong: %+v", g)
	}
	if g.ECC == nil || *g.ECC.VolatileCorrected != 3 || *g.ECC.AggregateCorrected != 4 ||
		*g.ECC.VolatileUncorrected != 0 || *g.ECC.AggregateUncorrected != 7 {
		t.Errorf("GPU 1 ECC = %+v", g.ECC)
	}
	if g.RemappedRows == nil || g.RemappedRows.Corrected != 2 {
		t.Errorf("GPU 1 RemappedRows = %+v", g.RemappedRows)
	}
	// Lifetime (aggregate) uncorrected errors alone do not fail a GPU.
	if g.Health != gpu.HealthOK || len(g.Errors) != 0 {
		t.Errorf("GPU 1 health = %s %q, errors %q, want ok", g.Health, g.HealthReasons, g.Errors)
	}

	for _, tc := range []struct {
		index  int
		health gpu.Health
		reason string
	}{
		{0, gpu.HealthOK, ""},
		{2, gpu.HealthFailed, "uncorrectable ECC errors: 3"},
		{3, gpu.HealthDegraded, "row remapping pending"},
		{4, gpu.HealthFailed, "row remapping failure"},
		{5, gpu.HealthOK, ""},
		{6, gpu.HealthDegraded, "retired pages pending"},
		{7, gpu.HealthFailed, "ERROR_GPU_IS_LOST"},
	} {
		g := rep.GPUs[tc.index]
		if g.Health != tc.health {
			t.Errorf("GPU %d: health = %s %q, want %s", tc.index, g.Health, g.HealthReasons, tc.health)
		}
		if tc.reason != "" && !slices.ContainsFunc(g.HealthReasons, func(r string) bool { return strings.Contains(r, tc.reason) }) {
			t.Errorf("GPU %d: reasons %q lack %q", tc.index, g.HealthReasons, tc.reason)
		}
	}
	if got := rep.GPUs[4].HealthReasons; len(got) != 2 || !strings.Contains(got[0], "failure") {
		t.Errorf("GPU 4 reasons = %q, want failure first, then pending", got)
	}
	if got := rep.GPUs[5].Errors; !slices.Equal(got, []string{"serial: ERROR_NO_PERMISSION"}) {
		t.Errorf("GPU 5 Errors = %q", got)
	}
	if g := rep.GPUs[7]; g.UUID != "" || g.Index != 7 {
		t.Errorf("lost GPU = %+v", g)
	}
}

func TestCollectCorrectedECCSpike(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	var corrected uint64 = 5
	device(s, 0).GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, ctr nvml.EccCounterType) (uint64, nvml.Return) {
		if typ == nvml.MEMORY_ERROR_TYPE_CORRECTED && ctr == nvml.VOLATILE_ECC {
			return corrected, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
	c := newCollector(t, gpu.Config{NVML: s, CorrectedECCSpike: 50})

	for _, step := range []struct {
		corrected uint64
		want      gpu.Health
	}{
		{5, gpu.HealthOK},         // baseline
		{54, gpu.HealthOK},        // +49
		{104, gpu.HealthDegraded}, // +50
		{110, gpu.HealthOK},       // +6
	} {
		corrected = step.corrected
		g := collect(t, c).GPUs[0]
		if g.Health != step.want {
			t.Errorf("corrected=%d: health %s %q, want %s", step.corrected, g.Health, g.HealthReasons, step.want)
		}
	}
}

func TestCollectMIG(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	d := device(s, 0)
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v", ret)
	}
	mig := &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return "MIG-11111111-2222-3333-4444-555555555555", nvml.SUCCESS },
		GetNameFunc:              func() (string, nvml.Return) { return "NVIDIA A100-SXM4-40GB MIG 1g.5gb", nvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return 7, nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		GetMemoryInfoFunc:        func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 4864 << 20}, nvml.SUCCESS },
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 2 {
			return mig, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}

	g := collect(t, newCollector(t, gpu.Config{NVML: s})).GPUs[0]
	want := gpu.MIGDevice{Index: 2, UUID: "MIG-11111111-2222-3333-4444-555555555555",
		Name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", GPUInstanceID: 7, MemoryTotalBytes: 4864 << 20}
	if g.MIG == nil || !g.MIG.Enabled || !g.MIG.PendingEnabled || len(g.MIG.Devices) != 1 || g.MIG.Devices[0] != want {
		t.Errorf("MIG = %+v, want enabled with %+v", g.MIG, want)
	}
	if len(g.Errors) != 0 {
		t.Errorf("Errors = %q", g.Errors)
	}
}

func TestCollectNoDriver(t *testing.T) {
	t.Parallel()
	for _, ret := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED} {
		t.Run(ret.Error(), func(t *testing.T) {
			t.Parallel()
			s := newDGXA100()
			s.InitFunc = func() nvml.Return { return ret }
			rec := newRecorder(t)
			c := newCollector(t, gpu.Config{NVML: s, Logger: slog.New(rec)})

			for range 3 {
				rep, err := c.Collect(t.Context())
				if err != nil {
					t.Fatalf("Collect: %v", err)
				}
				if len(rep.GPUs) != 0 || rep.Status == "" || rep.NVML {
					t.Fatalf("Report = %+v, want no GPUs, a Status and no NVML", rep)
				}
			}
			if err := c.Watch(t.Context(), func(gpu.Event) { t.Error("unexpected event") }); err != nil {
				t.Fatalf("Watch: %v", err)
			}
			if n := rec.count(slog.LevelInfo, "No GPU inventory"); n != 1 {
				t.Errorf("logged %d times at info, want once", n)
			}
			if n := len(s.ShutdownCalls()); n != 0 {
				t.Errorf("Shutdown called %d times after a failed Init", n)
			}
		})
	}
}

func TestCollectErrors(t *testing.T) {
	t.Parallel()

	s := newDGXA100()
	s.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
	if _, err := newCollector(t, gpu.Config{NVML: s}).Collect(t.Context()); !errors.Is(err, nvml.ERROR_NO_PERMISSION) {
		t.Errorf("Init failure: err = %v, want ERROR_NO_PERMISSION", err)
	}

	s = newDGXA100()
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	if rep := collect(t, newCollector(t, gpu.Config{NVML: s})); len(rep.GPUs) != 0 || rep.Status == "" || !rep.NVML {
		t.Errorf("zero GPUs: Report = %+v, want a Status and NVML", rep)
	}
	if got, want := len(s.ShutdownCalls()), len(s.InitCalls()); got != want {
		t.Errorf("Shutdown called %d times for %d Inits", got, want)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := newCollector(t, gpu.Config{NVML: newDGXA100()}).Collect(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v, want context.Canceled", err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []gpu.Config{
		{EventWaitTimeout: time.Microsecond},
		{EventWaitTimeout: -time.Second},
		{EventRetryMax: -time.Second},
		{XIDDedupWindow: -time.Second},
	} {
		cfg.NVML = newDGXA100()
		if _, err := gpu.New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", cfg)
		}
	}
}

// TestCollectSystemNVML runs the production default (the system's
// libnvidia-ml). Without a driver it must report a Status, not an error;
// with one it must find GPUs.
func TestCollectSystemNVML(t *testing.T) {
	t.Parallel()
	rep := collect(t, newCollector(t, gpu.Config{}))
	if len(rep.GPUs) == 0 && rep.Status == "" {
		t.Errorf("no GPUs and no Status")
	}
	for _, g := range rep.GPUs {
		t.Logf("GPU %d %s %s health=%s reasons=%q errors=%q", g.Index, g.Name, g.UUID, g.Health, g.HealthReasons, g.Errors)
	}
	t.Logf("status: %q", rep.Status)
}
