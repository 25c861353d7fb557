package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/reconcilers/drift"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
)

// TestDriftAcrossPoolEndToEnd (issue 43): three FakeDaemons in one pool of
// a real deployment, one of them on another driver (535.104.05 where the
// others run 550.54.15): the control plane's drift job (every
// gpuHealth.driftInterval, 1 s here) stores one gpu.drift finding on that
// node and none on the others; the default policy maps it to none (the
// finding kept with outcome none, no case); `nodes get` shows the node's
// better-compute.io/drift label. Once the node reports the pool's driver
// again the label goes and a node.drift-ended event is written, with no
// second finding.
func TestDriftAcrossPoolEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top:     "remediation:\n  interval: 300ms\ngpuHealth:\n  driftInterval: 1s\n",
	})
	tokenFile, _ := d.joinToken(3, time.Hour)
	token := strings.TrimSpace(readFile(t, tokenFile))
	var fds []*sim.FakeDaemon
	for i := range 3 {
		fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: fmt.Sprintf("drift-%02d", i), Session: session.Config{StartJitter: -1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := fd.Join(ctx, d.gatewayURL, token); err != nil {
			t.Fatal(err)
		}
		simCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- fd.Run(simCtx) }()
		t.Cleanup(func() { stop(); <-done })
		fds = append(fds, fd)
	}
	odd := fds[2]
	odd.SetVersions("535.104.05", "")
	node := func(fd *sim.FakeDaemon) *store.Node {
		t.Helper()
		n, err := d.st.NodeGet(ctx, fd.NodeID())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	events := func(fd *sim.FakeDaemon, kind string) []*store.Event {
		t.Helper()
		es, err := d.st.EventList(ctx, &store.EventListParams{NodeID: fd.NodeID(), Limit: store.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		var out []*store.Event
		for _, e := range es {
			if e.Kind == kind {
				out = append(out, e)
			}
		}
		return out
	}
	for _, fd := range fds {
		eventually(t, 60*time.Second, func() bool {
			return node(fd).State == store.NodeReady && len(inventory(node(fd).Inventory).GetGpus()) == 8
		},
			func() string { return fd.Name() + " not ready with its inventory: " + node(fd).State })
	}

	eventually(t, 60*time.Second, func() bool { return len(events(odd, gpufinding.KindDrift)) > 0 },
		func() string { return "no gpu.drift finding on " + odd.Name() })
	e := events(odd, gpufinding.KindDrift)[0]
	f, err := gpufinding.Decode(e.Kind, e.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if s := f.GetDrift(); s.GetDriverVersion() != "535.104.05" || s.GetPoolDriverVersion() != "550.54.15" || s.GetCudaVersion() != "" ||
		s.GetPoolNodes() != 3 || s.GetMatchingNodes() != 2 || f.GetGpuUuid() != "" || f.GetResolution() != "UPDATE_SWFW" {
		t.Errorf("drift finding = %v", f)
	}
	const want = "driver 535.104.05 (pool 550.54.15)"
	if l := node(odd).Labels[drift.Label]; l != want {
		t.Errorf("label %s = %q, want %q", drift.Label, l, want)
	}
	if out := d.cli("nodes", "get", odd.NodeID()); !strings.Contains(out, drift.Label+"="+want) {
		t.Errorf("nodes get does not show the drift:\n%s", out)
	}
	eventually(t, 60*time.Second, func() bool {
		h, err := d.st.RemediationHistory(ctx, &store.RemediationHistoryParams{NodeID: odd.NodeID()})
		if err != nil {
			t.Fatal(err)
		}
		return len(h.Findings) > 0 && h.Findings[0].Kind == gpufinding.KindDrift && h.Findings[0].Outcome == store.FindingOutcomeNone
	}, func() string { return "the drift finding was not taken with outcome none" })
	if c := latestCase(t, d.st, odd.NodeID()); c != nil {
		t.Errorf("a case was opened for drift: %+v", c)
	}
	for _, fd := range fds[:2] {
		if es := events(fd, gpufinding.KindDrift); len(es) != 0 || node(fd).Labels[drift.Label] != "" {
			t.Errorf("%s drifts: %d events, label %q", fd.Name(), len(es), node(fd).Labels[drift.Label])
		}
	}

	odd.SetVersions("", "") // back on the pool's driver
	eventually(t, 60*time.Second, func() bool { return len(events(odd, drift.KindEnded)) == 1 },
		func() string { return "no node.drift-ended event" })
	if l, ok := node(odd).Labels[drift.Label]; ok {
		t.Errorf("label still there: %q", l)
	}
	if n := len(events(odd, gpufinding.KindDrift)); n != 1 {
		t.Errorf("%d gpu.drift findings, want the one", n)
	}
}
