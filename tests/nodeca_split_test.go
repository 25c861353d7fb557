package tests

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// splitRotationCertTTL is the node certificate life of
// TestNodeCARotationSplitRoles: short enough that all 203 nodes renew
// within the test, long enough that 200 FakeDaemons renewing on a busy
// 2-core machine keep their margin.
const splitRotationCertTTL = 20 * time.Second

// splitRotationHeld is how many FakeDaemons hold the bundle back at
// first: 5 of 203 live nodes is below the 0.99 threshold (201 needed);
// releasing 3 of them reaches it with 2 still missing.
const splitRotationHeld = 5

// rotationStatus is `pki rotate node-ca status -o json` with the node ids
// behind the counts.
type rotationStatus struct {
	Rotation struct {
		ID             string   `json:"id"`
		Phase          string   `json:"phase"`
		NewCAID        string   `json:"newCaId"`
		OldCAID        string   `json:"oldCaId"`
		Threshold      float64  `json:"threshold"`
		LiveNodes      int      `json:"liveNodes"`
		AckedNodes     int      `json:"ackedNodes"`
		MissingNodeIDs []string `json:"missingNodeIds"`
		NodesOffNewCA  int      `json:"nodesOffNewCa"`
		Ready          bool     `json:"ready"`
		Waiting        string   `json:"waiting"`
	} `json:"rotation"`
}

// rotation runs `pki rotate node-ca ARGS -o json` through the api process.
func (d *splitDeployment) rotation(t *testing.T, args ...string) rotationStatus {
	t.Helper()
	var v rotationStatus
	out := d.cli(t, append(append([]string{"pki", "rotate", "node-ca"}, args...), "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("pki rotate node-ca %v -o json: %v\n%s", args, err, out)
	}
	return v
}

// TestNodeCARotationSplitRoles rotates the node CA of the production shape
// on PostgreSQL (issue 34's "Done when"): an api, a worker
// (controllers, with the rotation reconciler) and two gateways as separate
// processes from one binary, three real bcd spread over both gateways and
// 200 FakeDaemons, certificates living 20 s, and commands to real and
// simulated nodes throughout. An operator runs `start`, and nothing else:
//
//   - status counts the acks and lists the nodes that have not acked (5
//     FakeDaemons hold the bundle back), and the rotation stays
//     propagating below the threshold;
//   - with 3 of them released (201 of 203, the threshold's ceiling) the
//     reconciler activates it, with the other 2 still missing;
//   - every real node ends on a certificate, in its data dir, issued by
//     the new CA (and every FakeDaemon on one too), and the reconciler
//     retires the old CA: status ends retired;
//   - every node keeps the session it had before start, and every command
//     created throughout succeeded.
func TestNodeCARotationSplitRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	d := newSplitDeploymentWith(t, 2, 1, func([]string) string {
		return fmt.Sprintf("    nodeCertTTL: %s\n", splitRotationCertTTL)
	})
	fleet := d.joinFleet(ctx, 100)
	var machines []*machine
	var bcds []*testenv.Proc
	var real, fake []string
	for i, g := range []*splitProc{d.gateways[0], d.gateways[1], d.gateways[0]} {
		m, id := d.joinMachine(fmt.Sprintf("rot-%02d", i+1), g)
		bcds = append(bcds, m.node())
		machines = append(machines, m)
		real = append(real, id)
	}
	for i, id := range real {
		d.waitSession(id, []*splitProc{d.gateways[0], d.gateways[1], d.gateways[0]}[i])
	}
	for _, dm := range fleet.daemons {
		fake = append(fake, dm.NodeID())
	}
	all := append(slices.Clone(real), fake...)
	before := d.sessionIDs(all)
	t.Logf("deployment up, 3 bcd and 200 FakeDaemons with sessions, %v since start", time.Since(began).Round(time.Millisecond))

	// Commands throughout: to every node at random, and to the real ones
	// on a stream of their own, so that each phase has some.
	toAll := startCommands(d.admin, all, 50*time.Millisecond)
	toReal := startCommands(d.admin, real, 250*time.Millisecond)
	var phaseCmds []string
	mark := func(phase string) {
		n := toReal.created()
		phaseCmds = append(phaseCmds, fmt.Sprintf("%s:%d", phase, n))
	}

	// Five FakeDaemons, over both gateways, hold the bundle back; the
	// stream leaves them alone meanwhile (their session reads nothing
	// while KeepBundle waits).
	var held []*sim.FakeDaemon
	var heldIDs []string
	for _, i := range []int{0, 1, 100, 101, 102} {
		held = append(held, fleet.daemons[i])
		heldIDs = append(heldIDs, fleet.daemons[i].NodeID())
	}
	toAll.exclude(heldIDs...)
	for _, dm := range held {
		dm.HoldBundle()
	}

	start := d.rotation(t, "start", "--reason", "e2e split roles")
	if start.Rotation.Phase != "propagating" || start.Rotation.Threshold != 0.99 {
		t.Fatalf("start: %+v", start.Rotation)
	}
	newCA, oldCA := start.Rotation.NewCAID, start.Rotation.OldCAID
	startedAt := time.Now()
	mark("started")

	// Status counts the acks of all but the held five, and lists those.
	live := len(all)
	var v rotationStatus
	eventually(t, 30*time.Second, func() bool {
		v = d.rotation(t, "status")
		return v.Rotation.LiveNodes == live && v.Rotation.AckedNodes == live-splitRotationHeld
	}, func() string {
		return fmt.Sprintf("status never counted %d acks of %d: %+v", live-splitRotationHeld, live, v.Rotation)
	})
	if !sameSet(v.Rotation.MissingNodeIDs, heldIDs) {
		t.Fatalf("status lists missing %v, want the held %v", v.Rotation.MissingNodeIDs, heldIDs)
	}
	if v.Rotation.Phase != "propagating" || v.Rotation.Ready {
		t.Fatalf("at %d of %d acks: %+v, want propagating and not ready", v.Rotation.AckedNodes, live, v.Rotation)
	}
	counted := time.Now()
	t.Logf("%d of %d acks %v after start; missing %v; waiting: %s", v.Rotation.AckedNodes, live,
		counted.Sub(startedAt).Round(time.Millisecond), v.Rotation.MissingNodeIDs, v.Rotation.Waiting)
	for _, m := range machines {
		if !slices.Contains(nodeCARootIDs(t, m), newCA) {
			t.Fatalf("node-ca.crt of %s does not hold the new CA %s", m.name, newCA)
		}
	}
	// A reconciler round (every rotation.DefaultInterval) passes below
	// the threshold: the rotation stays propagating.
	eventually(t, rotation.DefaultInterval+10*time.Second, func() bool {
		if v = d.rotation(t, "status"); v.Rotation.Phase != "propagating" {
			t.Fatalf("at %d of %d acks, below the threshold: %+v", v.Rotation.AckedNodes, live, v.Rotation)
		}
		return time.Since(counted) > rotation.DefaultInterval+time.Second
	}, func() string { return "" })
	mark("propagating")

	// Three released: 201 of 203 is the threshold's ceiling, and the
	// reconciler activates the rotation with two still missing.
	for _, dm := range held[:3] {
		dm.ReleaseBundle()
	}
	eventually(t, 30*time.Second, func() bool { v = d.rotation(t, "status"); return v.Rotation.Phase != "propagating" },
		func() string { return fmt.Sprintf("the reconciler never activated at the threshold: %+v", v.Rotation) })
	if v.Rotation.Phase != "activated" || v.Rotation.AckedNodes != live-2 || !sameSet(v.Rotation.MissingNodeIDs, heldIDs[3:]) {
		t.Fatalf("after the threshold: %+v, want activated with %d acks and %v missing", v.Rotation, live-2, heldIDs[3:])
	}
	d.workers[0].p.WaitLine(`msg="Node CA rotation advanced by the reconciler".*phase=activated`, 5*time.Second)
	t.Logf("activated by the reconciler %v after start at %d of %d acks", time.Since(startedAt).Round(time.Millisecond), v.Rotation.AckedNodes, live)
	mark("activated")
	for _, dm := range held[3:] {
		dm.ReleaseBundle()
	}
	toAll.include(heldIDs...)

	// Every node moves to the new CA at its next renewal; the reconciler
	// retires the old CA.
	roots := readCertsPEM(t, machines[0], "node-ca.crt")
	newRoot := nodeRootOf(t, roots, newCA)
	nodeRootOf(t, roots, oldCA)
	for _, m := range machines {
		eventually(t, 2*splitRotationCertTTL, func() bool { return issuedBy(t, m, roots, newCA) },
			func() string {
				return "the certificate in " + m.name + "'s data dir never came from the new CA " + newCA
			})
	}
	eventually(t, 2*splitRotationCertTTL+10*time.Second, func() bool { v = d.rotation(t, "status"); return v.Rotation.Phase == "retired" },
		func() string { return fmt.Sprintf("status never ended retired: %+v", v.Rotation) })
	d.workers[0].p.WaitLine(`msg="Node CA rotation advanced by the reconciler".*phase=retired`, 5*time.Second)
	t.Logf("retired by the reconciler %v after start", time.Since(startedAt).Round(time.Millisecond))
	mark("retired")
	for _, dm := range fleet.daemons {
		if leaf := dm.Identity().Chain[0]; leaf.CheckSignatureFrom(newRoot) != nil {
			t.Errorf("FakeDaemon %s ends on a certificate not issued by the new CA", dm.Name())
		}
		if dm.Bundle().Kept == 0 {
			t.Errorf("FakeDaemon %s kept no bundle", dm.Name())
		}
	}
	// Commands after retired, then the stream stops.
	n := toReal.created()
	eventually(t, 10*time.Second, func() bool { return toReal.created() >= n+3 },
		func() string { return "no commands to the real nodes after retired" })
	ids, errs := toAll.stopAndList()
	realIDs, realErrs := toReal.stopAndList()
	errs = append(errs, realErrs...)
	if len(errs) > 0 {
		t.Errorf("%d commands.create calls failed, the first: %v", len(errs), errs[0])
	}
	d.checkCommandsSucceeded(append(ids, realIDs...), phaseCmds)

	// One session per node throughout: the rotation and the renewals
	// closed none.
	after := d.sessionIDs(all)
	changed := 0
	for _, id := range all {
		if after[id] != before[id] {
			if changed++; changed <= 5 {
				t.Errorf("node %s: session %s before start, %s after retired", id, before[id], after[id])
			}
		}
	}
	for i, p := range bcds {
		if n := countLines(p, sessionEstablished); n != 1 {
			t.Errorf("bcd on %s established %d sessions, want 1", machines[i].name, n)
		}
	}
	t.Logf("TestNodeCARotationSplitRoles done in %v; %d of %d sessions changed", time.Since(began).Round(time.Millisecond), changed, len(all))
}

// sessionIDs reads the session id of each node from the sessions table.
func (d *splitDeployment) sessionIDs(nodes []string) map[string]string {
	d.t.Helper()
	out := map[string]string{}
	for _, id := range nodes {
		s, err := d.st.SessionGet(context.Background(), id)
		if err != nil {
			d.t.Fatalf("session of node %s: %v", id, err)
		}
		out[id] = s.SessionID
	}
	return out
}

// checkCommandsSucceeded waits until no command is left non-terminal and
// checks that every one in ids succeeded; marks say how many commands the
// real nodes' stream had created at each phase, for the log.
func (d *splitDeployment) checkCommandsSucceeded(ids, marks []string) {
	d.t.Helper()
	states := d.terminalStates(splitCommandTimeout + 10*time.Second)
	tally := map[string]int{}
	bad := 0
	for _, id := range ids {
		s, ok := states[id]
		tally[s]++
		if !ok || s != store.CommandSucceeded {
			if bad++; bad <= 10 {
				d.t.Errorf("command %s: state %q, want succeeded", id, s)
			}
		}
	}
	d.t.Logf("commands: %d created through the API, by state %v; the real nodes' stream by phase %v", len(ids), tally, marks)
}

// created counts the commands the stream created so far.
func (s *commandStream) created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// include targets nodes again (after exclude).
func (s *commandStream) include(nodes ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range nodes {
		if !slices.Contains(s.targets, n) {
			s.targets = append(s.targets, n)
		}
	}
}

// nodeRootOf returns the root with id among roots; it must be there.
func nodeRootOf(t *testing.T, roots []*x509.Certificate, id string) *x509.Certificate {
	t.Helper()
	for _, r := range roots {
		if pki.NodeCAID(r) == id {
			return r
		}
	}
	t.Fatalf("no node CA root %s among %d", id, len(roots))
	return nil
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
