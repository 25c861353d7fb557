package agent

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/report"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Why an inventory is scanned or sent, for the logs.
const (
	reasonWelcome  = "welcome"
	reasonPeriodic = "periodic"
	reasonGPUEvent = "gpu event"
	reasonRefresh  = sessionv1.KindInventoryRefresh
)

// report is the inventory loop: one goroutine does every scan after the
// first and every send of the Inventory, so scans never overlap.
func (a *Agent) report(ctx context.Context) error {
	tick := make(chan struct{}, 1)
	timer := a.clock.AfterFunc(a.cfg.RescanInterval, func() { signal(tick) })
	defer func() { timer.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.connected:
			a.flushEvents(ctx)
			a.sendInventory(ctx, reasonWelcome)
		case <-tick:
			_ = a.rescan(ctx, false, reasonPeriodic)
			timer = a.clock.AfterFunc(a.cfg.RescanInterval, func() { signal(tick) })
		case <-a.gpuChanged:
			_ = a.rescan(ctx, false, reasonGPUEvent)
		case done := <-a.refresh:
			done <- a.rescan(ctx, true, reasonRefresh)
		}
	}
}

// refreshInventory is the executor's inventory.refresh: a scan and a send,
// done by the inventory loop.
func (a *Agent) refreshInventory(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case a.refresh <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// rescan scans the host and sends the Inventory when its digest changed,
// or always when force is set. It fails only when ctx ends.
func (a *Agent) rescan(ctx context.Context, force bool, reason string) error {
	host, err := a.scanner.Scan(ctx)
	if err != nil {
		return fmt.Errorf("scan inventory: %w", err)
	}
	a.scanFindings(ctx, host)
	if changed := a.setInventory(host); changed || force {
		if changed {
			a.log.InfoContext(ctx, "Inventory changed", attrReason, reason, attrDigest, a.currentDigest(),
				attrGPUs, len(host.GPUs))
		}
		a.sendInventory(ctx, reason)
	}
	return nil
}

// setInventory keeps host as the latest inventory and reports whether its
// digest differs from the one before.
func (a *Agent) setInventory(host *inventory.Host) bool {
	var plugins []*sessionv1.PluginInfo
	if a.cfg.Plugins != nil {
		plugins = a.cfg.Plugins()
	}
	inv := report.Inventory(host, plugins, a.clock.Now())
	inv.GpusSeen = a.gpusSeen(host)
	a.mu.Lock()
	defer a.mu.Unlock()
	changed := a.inv != nil && a.inv.GetDigest() != inv.GetDigest()
	a.inv = inv
	d := inv.GetDigest()
	a.digest.Store(&d)
	return changed
}

// currentDigest is the digest of the latest inventory, for Hello and
// heartbeats.
func (a *Agent) currentDigest() string { return *a.digest.Load() }

// sendInventory sends the latest inventory. Without a session it is not
// sent: the next Welcome sends it.
func (a *Agent) sendInventory(ctx context.Context, reason string) {
	a.mu.Lock()
	inv := a.inv
	a.mu.Unlock()
	if inv == nil {
		return
	}
	if err := a.send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Inventory{Inventory: inv}}); err != nil {
		a.log.DebugContext(ctx, "Inventory not sent; it goes after the next Welcome", attrReason, reason, logkey.Err, err)
		return
	}
	a.log.DebugContext(ctx, "Sent inventory", attrReason, reason, attrDigest, inv.GetDigest())
}

// gpusSeen adds the GPUs of host to the record of the GPUs seen on this
// machine (in the data directory; without one, only this scan's) and
// returns the record.
func (a *Agent) gpusSeen(host *inventory.Host) []string {
	uuids := make([]string, 0, len(host.GPUs))
	for _, g := range host.GPUs {
		uuids = append(uuids, g.UUID)
	}
	if a.seen == nil {
		return uuids
	}
	all, err := a.seen.Add(uuids)
	if err != nil {
		a.log.Warn("GPUs seen not recorded", logkey.Err, err)
	}
	return all
}
