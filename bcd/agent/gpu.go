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
	"github.com/better-compute/better-compute/bcd/inventory/report"
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

// watchKernelLog runs the GPU collector's WatchKernelLog until ctx ends;
// when the log cannot be read (no permission, no helper) it says so and
// tries again after RescanInterval.
func (a *Agent) watchKernelLog(ctx context.Context) {
	for {
		err := a.gpu.WatchKernelLog(ctx, a.kernelLog, func(ev gpu.Event) { a.gpuEvent(ctx, ev) })
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

// scanFindings sends the findings a scan's readings made anew
// (gpu.GPU.NewFindings: row remapping, recovery action, clocks, NVLink, ECC
// counts, ...), as gpuEvent sends an XID, without starting another scan.
func (a *Agent) scanFindings(ctx context.Context, host *inventory.Host) {
	var evs []gpu.Event
	for _, g := range host.GPUs {
		evs = append(evs, g.NewFindings...)
	}
	if len(evs) > 0 {
		a.queueEvents(ctx, evs)
	}
}

// queueEvents sends evs at once or keeps them (at most MaxPendingEvents,
// the oldest dropped first) for the next session.
func (a *Agent) queueEvents(ctx context.Context, evs []gpu.Event) {
	a.evMu.Lock()
	for _, ev := range evs {
		a.events = append(a.events, eventMessage(ev))
	}
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
