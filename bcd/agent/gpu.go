package agent

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
	"github.com/better-compute/better-compute/bcd/inventory/report"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// watchGPUs runs the GPU collector's Watch until ctx ends. Watch returns
// nil at once on a host without NVML (it says so at info level) and an
// error only when NVML fails otherwise; then it is tried again after
// RescanInterval.
func (a *Agent) watchGPUs(ctx context.Context) {
	for {
		err := a.gpu.Watch(ctx, func(ev gpu.Event) { a.gpuEvent(ctx, ev) })
		if err == nil || ctx.Err() != nil {
			return
		}
		a.log.WarnContext(ctx, "Cannot watch GPU events", logkey.Err, err, attrRetryIn, a.cfg.RescanInterval)
		if !a.sleep(ctx, a.cfg.RescanInterval) {
			return
		}
	}
}

// watchKernelLog runs the GPU collector's WatchKernelLog until ctx ends,
// each record passed to the InfiniBand monitor too (ibLog); when the log
// cannot be read (no permission, no helper) it says so and tries again
// after RescanInterval.
func (a *Agent) watchKernelLog(ctx context.Context) {
	src := ibLog{src: a.kernelLog, ib: a.ib, found: func(f ib.Finding) { a.ibFinding(ctx, f) }}
	for {
		err := a.gpu.WatchKernelLog(ctx, src, func(ev gpu.Event) { a.gpuEvent(ctx, ev) })
		if ctx.Err() != nil {
			return
		}
		a.log.WarnContext(ctx, "Cannot read XIDs from the kernel log; NVML events still count", logkey.Err, err, attrRetryIn, a.cfg.RescanInterval)
		if !a.sleep(ctx, a.cfg.RescanInterval) {
			return
		}
	}
}

// replayResets tells the GPU collector of the GPU resets this bcd, or one
// before it, did in this boot (the journal's succeeded gpu.reset commands),
// so that the kernel log's look-back does not bring back the XIDs they
// cleared.
func (a *Agent) replayResets(bootID string) {
	if a.journal == nil || bootID == "" {
		return
	}
	for _, r := range a.journal.Records() {
		if r.Kind != sessionv1.KindGPUReset || r.BootID != bootID || r.Result.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
			continue
		}
		var d struct {
			GPUUUID string `json:"gpuUuid"`
		}
		if json.Unmarshal(r.Result.GetDetailJson(), &d) == nil && d.GPUUUID != "" && r.Result.GetFinishedAt() != nil {
			a.gpu.ResetDoneAt(d.GPUUUID, r.Result.GetFinishedAt().AsTime())
		}
	}
}

// gpuEvent sends ev at once (or keeps it for the next session) and starts a
// scan, which sends the Inventory when the GPU's health changed.
func (a *Agent) gpuEvent(ctx context.Context, ev gpu.Event) {
	a.queueEvents(ctx, []gpu.Event{ev})
	signal(a.gpuChanged)
}

// ibLog is a KernelLog that passes each record of src to the InfiniBand
// monitor (its mlx5_core lines) before the GPU collector reads it.
type ibLog struct {
	src   gpu.KernelLog
	ib    *ib.Monitor
	found func(ib.Finding)
}

// FollowKernelLog implements gpu.KernelLog.
func (l ibLog) FollowKernelLog(ctx context.Context, fn func(record string)) error {
	return l.src.FollowKernelLog(ctx, func(record string) {
		if f, ok := l.ib.KernelRecord(record); ok {
			l.found(f)
		}
		fn(record)
	})
}

// ibFinding sends an InfiniBand finding of the kernel log at once (or
// keeps it for the next session) and starts a scan, which sends the
// Inventory when a port's health changed.
func (a *Agent) ibFinding(ctx context.Context, f ib.Finding) {
	a.queue(ctx, []*sessionv1.Event{ibEventMessage(f)})
	signal(a.gpuChanged)
}

// scanFindings sends the findings a scan's readings made anew
// (gpu.GPU.NewFindings: row remapping, recovery action, clocks, NVLink, ECC
// counts, ...; ib.Port.NewFindings), as gpuEvent sends an XID, without
// starting another scan.
func (a *Agent) scanFindings(ctx context.Context, host *inventory.Host) {
	var evs []gpu.Event
	for _, g := range host.GPUs {
		evs = append(evs, g.NewFindings...)
	}
	if len(evs) > 0 {
		a.queueEvents(ctx, evs)
	}
	var ibs []*sessionv1.Event
	for _, p := range host.IBPorts {
		for _, f := range p.NewFindings {
			ibs = append(ibs, ibEventMessage(f))
		}
	}
	if len(ibs) > 0 {
		a.queue(ctx, ibs)
	}
}

// queueEvents sends evs at once or keeps them (at most MaxPendingEvents,
// the oldest dropped first) for the next session.
func (a *Agent) queueEvents(ctx context.Context, evs []gpu.Event) {
	ms := make([]*sessionv1.Event, 0, len(evs))
	for _, ev := range evs {
		ms = append(ms, eventMessage(ev))
	}
	a.queue(ctx, ms)
}

// queue sends ms at once or keeps them (at most MaxPendingEvents, the
// oldest dropped first) for the next session.
func (a *Agent) queue(ctx context.Context, ms []*sessionv1.Event) {
	a.evMu.Lock()
	a.events = append(a.events, ms...)
	if n := len(a.events) - MaxPendingEvents; n > 0 {
		a.log.WarnContext(ctx, "Dropped GPU events kept while without a session", attrDropped, n)
		a.events = a.events[n:]
	}
	a.evMu.Unlock()
	a.flushEvents(ctx)
}

// flushEvents sends the kept events in order, keeping those it could not
// send.
func (a *Agent) flushEvents(ctx context.Context) {
	a.evMu.Lock()
	defer a.evMu.Unlock()
	for len(a.events) > 0 {
		ev := a.events[0]
		if err := a.send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: ev}}); err != nil {
			a.log.InfoContext(ctx, "GPU event kept for the next session", attrKind, ev.GetKind(), logkey.Err, err)
			return
		}
		a.events[0] = nil
		a.events = a.events[1:]
	}
	a.events = nil
}

// eventMessage converts a GPU event into the session's Event: its typed
// finding (report.Finding), repeated in the flat fields for gateways that
// predate it.
func eventMessage(ev gpu.Event) *sessionv1.Event {
	m := &sessionv1.Event{
		GpuFinding:  report.Finding(ev),
		Kind:        ev.Kind,
		Time:        timestamppb.New(ev.Time),
		Severity:    severity(ev.Severity),
		GpuUuid:     ev.GPUUUID,
		Xid:         uint32(ev.XID),
		Message:     ev.Message,
		XidMnemonic: ev.XIDMnemonic,
		Resolution:  ev.Resolution,
	}
	if ev.Source != "" {
		m.Attributes = map[string]string{"source": ev.Source}
		if ev.PID != 0 {
			m.Attributes["pid"] = strconv.Itoa(ev.PID)
		}
		if ev.Process != "" {
			m.Attributes["process"] = ev.Process
		}
	}
	return m
}

// ibEventMessage converts an InfiniBand finding into the session's Event
// (kind gpufinding.KindInfiniBand) carrying its typed finding
// (report.InfiniBandFinding); its resolution repeated in the flat field.
func ibEventMessage(f ib.Finding) *sessionv1.Event {
	sev := sessionv1.Severity_SEVERITY_WARNING
	if f.Health == ib.HealthFailed {
		sev = sessionv1.Severity_SEVERITY_CRITICAL
	}
	return &sessionv1.Event{GpuFinding: report.InfiniBandFinding(f), Kind: gpufinding.KindInfiniBand,
		Time: timestamppb.New(f.Time), Severity: sev, Message: f.Message, Resolution: f.Resolution,
		Attributes: map[string]string{"source": f.Source}}
}

func severity(s gpu.Severity) sessionv1.Severity {
	switch s {
	case gpu.SeverityInfo:
		return sessionv1.Severity_SEVERITY_INFO
	case gpu.SeverityWarning:
		return sessionv1.Severity_SEVERITY_WARNING
	case gpu.SeverityCritical:
		return sessionv1.Severity_SEVERITY_CRITICAL
	}
	return sessionv1.Severity_SEVERITY_UNSPECIFIED
}

// sleep waits d on the agent's clock or until ctx ends, and reports
// whether d passed.
func (a *Agent) sleep(ctx context.Context, d time.Duration) bool {
	done := make(chan struct{})
	t := a.clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}
