package tests

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/jointoken"
	"github.com/better-compute/better-compute/tests/testenv"
)

// gatewayRotation runs `pki rotate gateway-ca ARGS -o json` through the api
// process.
func (d *splitDeployment) gatewayRotation(t *testing.T, args ...string) gatewayRotationView {
	t.Helper()
	var v gatewayRotationView
	out := d.cli(t, append(append([]string{"pki", "rotate", "gateway-ca"}, args...), "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("pki rotate gateway-ca %v -o json: %v\n%s", args, err, out)
	}
	return v
}

// TestGatewayCARotationSplitRoles rotates the gateway serving CA of the
// production shape on PostgreSQL (issue 35's "Done when"): an api, a
// worker (with the rotation reconciler) and two gateways as separate
// processes from one binary and one pair of gateway certificate files,
// three real bcd spread over both gateways, 100 FakeDaemons (two of them,
// one per gateway, hold the bundle back until the new machine joined),
// commands to real and simulated nodes throughout, and a `nodes
// port-forward` tunnel through the api process, which relays it over the
// internal control API to the gateway holding the node (the second), open
// on one TCP connection from before start to after retirement:
//
//   - an install line (`nodes add`) made before start, run as printed (curl
//     fetches install.sh from the api process, which pins the signed
//     release in the downloads folder; the script, under sh in a machine's
//     namespaces and a BCD_ROOT with systemctl stubbed as in
//     TestNodesAddOverHTTPS, downloads bcd from the api and joins through
//     the first live gateway), joins a new machine while the rotation
//     propagates, and its bcd, started as the unit would, gets a session;
//   - status counts the acks, lists the held daemons and a spare token
//     made before start; released, the reconciler in the worker activates;
//   - each gateway process then serves a chain from the new CA that both
//     the old and the new pin verify;
//   - advance to retired is refused naming the spare token, --force
//     retires and revokes it, and each gateway serves the new CA's chain
//     alone, which the old pin no longer verifies;
//   - every node keeps the session it had, every command succeeded, and
//     each real bcd's identity.json pins the new CA.
func TestGatewayCARotationSplitRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	// The install line needs a signed bcd release in the downloads folder
	// (over plain HTTP the script pins the release), and the tunnel the
	// internal control API.
	dist := filepath.Join(t.TempDir(), "dist")
	copyFile(t, bcdAt(t, "0.1.0"), filepath.Join(dist, "0.1.0", buildDir("bcd"), "bcd"), 0o755)
	releasePin := signRelease(t, filepath.Join(dist, "0.1.0"), "0.1.0")
	internal := internalAPIConfig(t)
	d := newSplitDeploymentWith(t, 2, 1, func(env []string) string {
		return internal(env) + "downloads:\n  dir: " + dist + "\n  releasePins: [" + releasePin + "]\n"
	})
	fleet := d.joinFleet(ctx, 50)
	on := []*splitProc{d.gateways[0], d.gateways[1], d.gateways[0]}
	var machines []*machine
	var bcds []*testenv.Proc
	var real, fake []string
	for i, g := range on {
		m, id := d.joinMachine(fmt.Sprintf("gwca-split-%02d", i+1), g)
		bcds = append(bcds, m.node())
		machines, real = append(machines, m), append(real, id)
	}
	for i, id := range real {
		d.waitSession(id, on[i])
	}
	for _, dm := range fleet.daemons {
		fake = append(fake, dm.NodeID())
	}
	all := append(slices.Clone(real), fake...)
	before := d.sessionIDs(all)

	toAll := startCommands(d.admin, all, 100*time.Millisecond)
	toReal := startCommands(d.admin, real, 300*time.Millisecond)
	var marks []string
	mark := func(phase string) { marks = append(marks, fmt.Sprintf("%s:%d", phase, toReal.created())) }
	through := echoTunnel(t, []string{"BETTER_COMPUTE_URL=" + strings.TrimSuffix(d.api, "/api"), "BETTER_COMPUTE_TOKEN=" + d.admin.Token},
		d.bin, real[1])
	through("before start")

	// Made before start: an install line and a spare token of two uses.
	line := strings.TrimSpace(d.cli(t, "nodes", "add", "--pool", "default"))
	if !regexp.MustCompile(`^curl .*/api/install\.sh' && BCD_JOIN_TOKEN='bct1\.[^']+' sh install-bcd\.sh$`).MatchString(line) {
		t.Fatalf("nodes add printed %q", line)
	}
	var spare struct {
		JoinToken struct {
			ID string `json:"id"`
		} `json:"joinToken"`
	}
	if err := json.Unmarshal([]byte(d.cli(t, "join-tokens", "create", "--pool", "default", "--max-uses", "2", "--ttl", "1h", "-o", "json")), &spare); err != nil || spare.JoinToken.ID == "" {
		t.Fatalf("join-tokens create -o json: %+v, %v", spare, err)
	}
	held := []*sim.FakeDaemon{fleet.daemons[0], fleet.daemons[50]} // one per gateway
	heldIDs := []string{held[0].NodeID(), held[1].NodeID()}
	toAll.exclude(heldIDs...) // a held session reads no command
	for _, dm := range held {
		dm.HoldBundle()
	}
	t.Logf("deployment up, 3 bcd and %d FakeDaemons with sessions, tunnel open, %v since start", len(fake), time.Since(began).Round(time.Millisecond))

	v := d.gatewayRotation(t, "start", "--reason", "e2e split roles")
	if v.Rotation.Phase != "propagating" || v.Rotation.CA != "gateway" {
		t.Fatalf("start: %+v", v.Rotation)
	}
	startedAt := time.Now()
	b, err := bootstrap.LoadBundle(ctx, d.st, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	oldPin, newPin := b.GatewayPins()[0], b.GatewayPins()[1]
	mark("started")

	// The install line made before start, run as printed on a new machine.
	inst, h := testenv.NewMachine(t, "gwca-split-install"), newHost(t)
	inst.BCD = "sh" // the machine's shell: the pasted line runs there
	bin, args := inst.Argv("-c", "cd "+t.TempDir()+" && "+line)
	code, stdout, stderr := testenv.Run(t, []string{"BCD_ROOT=" + h.root, "STUB_LOG=" + h.log, "PATH=" + h.stubs + ":" + os.Getenv("PATH")}, "", bin, args...)
	if code != 0 {
		t.Fatalf("the install line while propagating: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("the install line made before start, run while propagating:\n%s", stdout)
	inst.BCD, inst.DataDir = filepath.Join(h.root, "usr/local/bin/bcd"), filepath.Join(h.root, "var/lib/bcd")
	bin, args = inst.Argv("node", "--data-dir", inst.DataDir)
	bcds = append(bcds, testenv.Start(t, nil, bin, args...))
	machines = append(machines, &machine{t: t, name: inst.Name, dataDir: inst.DataDir, idFile: inst.IDFile, bootIDFile: inst.BootIDFile})
	var ident struct {
		NodeID string `json:"node_id"`
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(inst.DataDir, "identity.json"))), &ident); err != nil || ident.NodeID == "" {
		t.Fatalf("identity.json of the installed machine: %+v, %v", ident, err)
	}
	eventually(t, 90*time.Second, func() bool {
		n, err := d.st.NodeGet(ctx, ident.NodeID)
		s, serr := d.st.SessionGet(ctx, ident.NodeID)
		if err == nil && serr == nil && n.State == store.NodeReady {
			before[ident.NodeID] = s.SessionID
			return true
		}
		return false
	}, func() string { return "the installed machine's node " + ident.NodeID + " never got a session" })
	real, all = append(real, ident.NodeID), append(all, ident.NodeID)
	toReal.include(ident.NodeID)
	toAll.include(ident.NodeID)

	// Status counts every ack but the held ones and names the spare token;
	// the rotation waits.
	eventually(t, 2*time.Minute, func() bool {
		v = d.gatewayRotation(t, "status")
		return v.Rotation.LiveNodes == len(all) && v.Rotation.AckedNodes == len(all)-len(held)
	}, func() string {
		return fmt.Sprintf("status never counted %d of %d acks: %+v", len(all)-len(held), len(all), v.Rotation)
	})
	if v.Rotation.Phase != "propagating" || !sameSet(v.Rotation.MissingNodeIDs, heldIDs) || !slices.Contains(v.Rotation.OldPinTokenIDs, spare.JoinToken.ID) {
		t.Fatalf("status while held: %+v; want propagating, %v missing and old-pin token %s", v.Rotation, heldIDs, spare.JoinToken.ID)
	}
	through("while propagating")
	mark("propagating")

	// Released: the reconciler in the worker activates; each gateway
	// process serves from the new CA a chain both pins verify.
	for _, dm := range held {
		dm.ReleaseBundle()
	}
	toAll.include(heldIDs...)
	eventually(t, 3*time.Minute, func() bool { v = d.gatewayRotation(t, "status"); return v.Rotation.Phase != "propagating" },
		func() string { return fmt.Sprintf("the reconciler never activated: %+v", v.Rotation) })
	if v.Rotation.Phase != "activated" {
		t.Fatalf("after the acks: %+v, want activated", v.Rotation)
	}
	d.workers[0].p.WaitLine(`msg="Gateway CA rotation advanced by the reconciler".*phase=activated`, 10*time.Second)
	t.Logf("activated by the reconciler %v after start", time.Since(startedAt).Round(time.Millisecond))
	if b, err = bootstrap.LoadBundle(ctx, d.st, testSecret); err != nil {
		t.Fatal(err)
	}
	newCA := b.GatewayCA.Cert
	if jointoken.Pin(newCA) != newPin {
		t.Fatal("the activated bundle's gateway CA is not the one prepared")
	}
	for _, g := range d.gateways {
		chain := waitGatewayChain(t, g, func(c []*x509.Certificate) bool { return c[0].CheckSignatureFrom(newCA) == nil },
			"a certificate from the new gateway CA")
		for _, pin := range []string{oldPin, newPin} {
			if err := jointoken.VerifyChain(pin, chain, "localhost", time.Now()); err != nil {
				t.Fatalf("%s while activated: the served chain does not verify with pin %s: %v", g.name, pin, err)
			}
		}
	}
	through("while activated")
	mark("activated")

	// Retiring is refused while the spare token can still be used, naming
	// it; --force retires and revokes it.
	code, stdout, stderr = testenv.Run(t, nil, "", d.bin, "pki", "rotate", "gateway-ca", "advance", "--reason", "e2e", "--server", d.api, "--token", d.admin.Token)
	if code == 0 || !strings.Contains(stderr, spare.JoinToken.ID) {
		t.Fatalf("advance with an old-pin token live: exit %d\n%s%s; want a refusal naming %s", code, stdout, stderr, spare.JoinToken.ID)
	}
	if v = d.gatewayRotation(t, "advance", "--force", "--reason", "e2e"); v.Rotation.Phase != "retired" {
		t.Fatalf("advance --force: %+v", v.Rotation)
	}
	if tok, err := d.st.JoinTokenGet(ctx, spare.JoinToken.ID); err != nil || tok.RevokedAt == nil {
		t.Fatalf("the old-pin token after advance --force: %+v, %v; want it revoked", tok, err)
	}
	for _, g := range d.gateways {
		chain := waitGatewayChain(t, g, func(c []*x509.Certificate) bool { return len(c) == 2 && c[1].Equal(newCA) },
			"the new gateway CA's chain alone")
		if err := jointoken.VerifyChain(newPin, chain, "localhost", time.Now()); err != nil {
			t.Fatalf("%s retired: the served chain does not verify with the new pin: %v", g.name, err)
		}
		if jointoken.VerifyChain(oldPin, chain, "localhost", time.Now()) == nil {
			t.Fatalf("%s retired: the served chain still verifies with the old pin", g.name)
		}
	}
	through("after retirement")
	mark("retired")

	// Commands after retirement, then the streams stop; every one
	// succeeded.
	n := toReal.created()
	eventually(t, 30*time.Second, func() bool { return toReal.created() >= n+3 },
		func() string { return "no commands to the real nodes after retirement" })
	ids, errs := toAll.stopAndList()
	realIDs, realErrs := toReal.stopAndList()
	if errs = append(errs, realErrs...); len(errs) > 0 {
		t.Errorf("%d commands.create calls failed, the first: %v", len(errs), errs[0])
	}
	d.checkCommandsSucceeded(append(ids, realIDs...), marks)

	// No session dropped; every bcd pins the new CA on disk, every
	// FakeDaemon holds it.
	after := d.sessionIDs(all)
	for _, id := range all {
		if after[id] != before[id] {
			t.Errorf("node %s: session %s before start, %s at the end", id, before[id], after[id])
		}
	}
	for i, p := range bcds {
		if n := countLines(p, sessionEstablished); n != 1 {
			t.Errorf("bcd on %s established %d sessions, want 1", machines[i].name, n)
		}
	}
	for _, m := range machines {
		checkPinsGatewayCA(t, m.name, m.dataDir, newPin)
	}
	for _, dm := range fleet.daemons {
		if r := dm.Bundle(); r.GatewayKept == 0 || !slices.ContainsFunc(r.GatewayRoots, newCA.Equal) {
			t.Errorf("FakeDaemon %s kept no gateway roots with the new CA", dm.Name())
		}
	}
	t.Logf("TestGatewayCARotationSplitRoles done in %v", time.Since(began).Round(time.Millisecond))
}

// waitGatewayChain waits until gateway process g serves a chain for which
// ok holds (what says what it should be) and returns it.
func waitGatewayChain(t *testing.T, g *splitProc, ok func([]*x509.Certificate) bool, what string) []*x509.Certificate {
	t.Helper()
	u, err := url.Parse(g.url)
	if err != nil {
		t.Fatal(err)
	}
	var chain []*x509.Certificate
	eventually(t, time.Minute, func() bool { chain = gatewayChain(t, u.Host); return ok(chain) },
		func() string { return fmt.Sprintf("%s never served %s (%d certificates)", g.name, what, len(chain)) })
	return chain
}
