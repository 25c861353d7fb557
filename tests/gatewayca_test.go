package tests

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/proto/jointoken"
	"github.com/better-compute/better-compute/tests/testenv"
)

// gatewayCAFakes is how many FakeDaemons TestGatewayCARotation runs beside
// its real bcd; gatewayCAHeld of them hold the bundle back until a machine
// joined while the rotation propagates.
const (
	gatewayCAFakes = 200
	gatewayCAHeld  = 3
)

// gatewayRotationView is `pki rotate gateway-ca status -o json`'s rotation.
type gatewayRotationView struct {
	Rotation struct {
		ID             string   `json:"id"`
		CA             string   `json:"ca"`
		Phase          string   `json:"phase"`
		NewCAID        string   `json:"newCaId"`
		OldCAID        string   `json:"oldCaId"`
		LiveNodes      int      `json:"liveNodes"`
		AckedNodes     int      `json:"ackedNodes"`
		MissingNodeIDs []string `json:"missingNodeIds"`
		OldPinTokens   int      `json:"oldPinTokens"`
		OldPinTokenIDs []string `json:"oldPinTokenIds"`
		Waiting        string   `json:"waiting"`
	} `json:"rotation"`
}

// gatewayChain dials the gateway listening on addr (host:port) and returns
// the chain it serves, leaf first, without verifying it.
func gatewayChain(t *testing.T, addr string) []*x509.Certificate {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{InsecureSkipVerify: true, ServerName: "localhost", MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates
}

// TestGatewayCARotation rotates the gateway serving CA of a deployment
// (serve with every role, SQLite) with three real bcd, 200 FakeDaemons and a
// port-forward tunnel open throughout (DESIGN.md, "CA rotation"; issue 35
// item 1's "Done when"): an install line made before start joins a new
// machine while the rotation propagates (held there by FakeDaemons that
// keep the bundle back); status counts the acks; the reconciler activates
// the rotation, and the gateway then serves a certificate from the new CA
// with a chain that both the old and the new pin verify; advance to retired
// is refused while a join token made before start can still be used, naming
// it (after it joined another machine while activated), and --force
// retires and revokes it (audited); the gateway ends on the new CA alone. No session is dropped and the tunnel carries bytes at the
// end.
func TestGatewayCARotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	// nodes add needs a signed bcd release in the downloads folder for its
	// install line (over plain HTTP the script pins the release).
	dist := filepath.Join(t.TempDir(), "dist")
	copyFile(t, testenv.Binary(t, "bcd"), filepath.Join(dist, "0.1.0", buildDir("bcd"), "bcd"), 0o755)
	releasePin := signRelease(t, filepath.Join(dist, "0.1.0"), "0.1.0")
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{top: "downloads:\n  dir: " + dist + "\n  releasePins: [" + releasePin + "]\n",
		// 200 FakeDaemons join from one address.
		gateway: "    limits: {pendingPerSource: 256, queuedPerSource: 4096, joinsPerSecond: 1000, joinBurst: 1000}\n"})
	gwStatus := func() gatewayRotationView {
		var v gatewayRotationView
		d.cliJSON(&v, d.viaAPI("pki", "rotate", "gateway-ca", "status")...)
		return v
	}
	gwRotate := func(args ...string) gatewayRotationView {
		var v gatewayRotationView
		d.cliJSON(&v, d.viaAPI(append([]string{"pki", "rotate", "gateway-ca"}, args...)...)...)
		return v
	}

	// Three real bcd, then the FakeDaemons.
	tokenFile, _ := d.joinToken(3, time.Hour)
	var machines []*machine
	var procs []*testenv.Proc
	var ids []string
	for i := range 3 {
		m := newMachine(t, fmt.Sprintf("gwca-%02d", i))
		ids = append(ids, m.mustJoin(d.gatewayURL, tokenFile))
		p := m.node()
		p.WaitLine(sessionEstablished.String(), 30*time.Second)
		machines, procs = append(machines, m), append(procs, p)
	}
	fakeToken, _ := d.joinToken(gatewayCAFakes, time.Hour)
	fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: d.gatewayURL, Token: strings.TrimSpace(readFile(t, fakeToken)),
		N: gatewayCAFakes, NamePrefix: "gwca-fake", NoInventory: true, Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Join(ctx); err != nil {
		t.Fatal(err)
	}
	fakes := fl.Daemons()
	for _, f := range fakes[:gatewayCAHeld] {
		f.HoldBundle()
	}
	runDaemons(t, fakes)
	for _, f := range fakes {
		ids = append(ids, f.NodeID())
	}
	sessions := map[string]string{}
	eventually(t, 60*time.Second, func() bool {
		for _, id := range ids {
			s, err := d.st.SessionGet(ctx, id)
			if err != nil {
				return false
			}
			sessions[id] = s.SessionID
		}
		return true
	}, func() string { return fmt.Sprintf("%d of %d nodes have a session", len(sessions), len(ids)) })

	// A tunnel open throughout: one TCP connection through nodes
	// port-forward to an echo server on the first bcd's machine.
	through := echoTunnel(t, []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + d.adminToken}, d.bc, ids[0])
	through("before start")

	// Made before start: an install line (nodes add) and a spare token.
	line := d.cli(d.viaAPI("nodes", "add", "--pool", "default")...)
	mt := regexp.MustCompile(`BCD_JOIN_TOKEN='(bct1\.[^']+)'`).FindStringSubmatch(line)
	if mt == nil {
		t.Fatalf("nodes add printed %q", line)
	}
	installToken := filepath.Join(t.TempDir(), "install-token")
	if err := os.WriteFile(installToken, []byte(mt[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spareFile, spare := d.joinToken(2, time.Hour)
	oldBundle, err := bootstrap.LoadBundle(ctx, d.st, d.secret())
	if err != nil {
		t.Fatal(err)
	}
	oldPin := oldBundle.GatewayPin()
	t.Logf("deployment up, 3 bcd and %d FakeDaemons with sessions, tunnel open, %v since start", len(fakes), time.Since(began).Round(time.Millisecond))

	v := gwRotate("start", "--reason", "test")
	if v.Rotation.Phase != "propagating" || v.Rotation.CA != "gateway" {
		t.Fatalf("start: %+v", v.Rotation)
	}
	b, err := bootstrap.LoadBundle(ctx, d.st, d.secret())
	if err != nil {
		t.Fatal(err)
	}
	newPin := b.GatewayPins()[1]
	// A token made now pins both CAs.
	bothFile, _ := d.joinToken(1, time.Hour)
	both, err := jointoken.Parse(readFile(t, bothFile))
	if err != nil || !slices.Equal(both.Pins(), []string{oldPin, newPin}) {
		t.Fatalf("a token made while propagating pins %v (%v), want the old and the new gateway CA", both.Pins(), err)
	}

	// The install line made before start joins a new machine.
	late := newMachine(t, "gwca-late")
	lateID := late.mustJoin(d.gatewayURL, installToken)
	lp := late.node()
	lp.WaitLine(sessionEstablished.String(), 30*time.Second)
	machines, procs, ids = append(machines, late), append(procs, lp), append(ids, lateID)
	eventually(t, 10*time.Second, func() bool {
		s, err := d.st.SessionGet(ctx, lateID)
		if err == nil {
			sessions[lateID] = s.SessionID
		}
		return err == nil
	}, func() string { return "no session of the late machine" })

	// Status counts every ack but the held ones; the rotation waits.
	eventually(t, 30*time.Second, func() bool {
		v = gwStatus()
		return v.Rotation.LiveNodes == len(ids) && v.Rotation.AckedNodes == len(ids)-gatewayCAHeld
	}, func() string {
		return fmt.Sprintf("status never counted %d of %d acks: %+v", len(ids)-gatewayCAHeld, len(ids), v.Rotation)
	})
	for _, f := range fakes[:gatewayCAHeld] {
		if !slices.Contains(v.Rotation.MissingNodeIDs, f.NodeID()) {
			t.Fatalf("status does not list the held FakeDaemon %s: %v", f.NodeID(), v.Rotation.MissingNodeIDs)
		}
	}
	if v.Rotation.Phase != "propagating" || !slices.Contains(v.Rotation.OldPinTokenIDs, spare) {
		t.Fatalf("status while held: %+v", v.Rotation)
	}
	through("while propagating")

	// Released: the reconciler activates; the gateway serves from the new
	// CA a chain both pins verify.
	for _, f := range fakes[:gatewayCAHeld] {
		f.ReleaseBundle()
	}
	eventually(t, 30*time.Second, func() bool { return gwStatus().Rotation.Phase == "activated" },
		func() string { return fmt.Sprintf("never activated: %+v", gwStatus().Rotation) })
	if b, err = bootstrap.LoadBundle(ctx, d.st, d.secret()); err != nil {
		t.Fatal(err)
	}
	newCA := b.GatewayCA.Cert
	if jointoken.Pin(newCA) != newPin {
		t.Fatal("the activated bundle's gateway CA is not the one prepared")
	}
	var chain []*x509.Certificate
	eventually(t, 15*time.Second, func() bool {
		chain = gatewayChain(t, d.gwAddr)
		return chain[0].CheckSignatureFrom(newCA) == nil
	}, func() string { return "the gateway never served a certificate from the new gateway CA" })
	for _, pin := range []string{oldPin, newPin} {
		if err := jointoken.VerifyChain(pin, chain, "localhost", time.Now()); err != nil {
			t.Fatalf("while activated the served chain does not verify with pin %s: %v", pin, err)
		}
	}
	through("while activated")

	// A token made before start still joins while activated: the gateway
	// serves the new CA, with a chain its one pin verifies.
	mid := newMachine(t, "gwca-activated")
	midID := mid.mustJoin(d.gatewayURL, spareFile)
	mp := mid.node()
	mp.WaitLine(sessionEstablished.String(), 30*time.Second)
	machines, procs, ids = append(machines, mid), append(procs, mp), append(ids, midID)
	eventually(t, 10*time.Second, func() bool {
		s, err := d.st.SessionGet(ctx, midID)
		if err == nil {
			sessions[midID] = s.SessionID
		}
		return err == nil
	}, func() string { return "no session of the machine joined while activated" })

	// Retiring is refused while the spare token made before start can
	// still be used, naming it; --force revokes it.
	code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, append([]string{"--config", d.cfgFile},
		d.viaAPI("pki", "rotate", "gateway-ca", "advance", "--reason", "test")...)...)
	if code == 0 || !strings.Contains(stderr, spare) {
		t.Fatalf("advance with an old-pin token live: exit %d\n%s%s; want a refusal naming %s", code, stdout, stderr, spare)
	}
	if v = gwRotate("advance", "--force", "--reason", "test"); v.Rotation.Phase != "retired" {
		t.Fatalf("advance --force: %+v", v.Rotation)
	}
	if tok, err := d.st.JoinTokenGet(ctx, spare); err != nil || tok.RevokedAt == nil {
		t.Fatalf("the old-pin token %s after advance --force: %+v, %v; want it revoked", spare, tok, err)
	}
	revoked := false
	for _, e := range auditRows(t, d, rotation.AuditTokenRevoked) {
		revoked = revoked || e.Resource == "join-token/"+spare
	}
	if !revoked {
		t.Fatalf("no %s audit row for %s", rotation.AuditTokenRevoked, spare)
	}
	if code, stdout, stderr := newMachine(t, "gwca-retired").join(d.gatewayURL, spareFile); code == 0 {
		t.Fatalf("a join with the revoked old-pin token after retirement succeeded:\n%s%s", stdout, stderr)
	}
	eventually(t, 15*time.Second, func() bool {
		chain = gatewayChain(t, d.gwAddr)
		return len(chain) == 2 && chain[1].Equal(newCA)
	}, func() string {
		return fmt.Sprintf("the gateway never served the new CA's chain alone (%d certificates)", len(chain))
	})
	if err := jointoken.VerifyChain(newPin, chain, "localhost", time.Now()); err != nil {
		t.Fatalf("retired: the served chain does not verify with the new pin: %v", err)
	}
	if err := jointoken.VerifyChain(oldPin, chain, "localhost", time.Now()); err == nil {
		t.Fatal("retired: the served chain still verifies with the old pin")
	}

	// Every real bcd trusts the new CA on disk; no session was dropped;
	// the tunnel still carries bytes.
	for _, m := range machines {
		checkPinsGatewayCA(t, m.name, m.dataDir, newPin)
	}
	for _, f := range fakes {
		if r := f.Bundle(); r.GatewayKept == 0 || !slices.ContainsFunc(r.GatewayRoots, newCA.Equal) {
			t.Errorf("FakeDaemon %s kept no gateway roots with the new CA", f.Name())
		}
	}
	for i, p := range procs {
		if n := countLines(p, sessionEstablished); n != 1 {
			t.Errorf("%s: bcd established %d sessions, want 1", machines[i].name, n)
		}
	}
	for id, sid := range sessions {
		if s, err := d.st.SessionGet(ctx, id); err != nil || s.SessionID != sid {
			t.Errorf("node %s: session %v (%v) at the end, %s before the rotation", id, s, err, sid)
		}
	}
	through("after retired")
	t.Logf("gateway CA rotation with %d nodes done in %v", len(ids), time.Since(began).Round(time.Millisecond))
}

// echoTunnel starts `nodes port-forward` to an echo server on node's
// machine (bcd runs on this host, so its loopback is the node's), with env
// naming the API and a token, opens one TCP connection through it and
// returns a check that sends a line through that connection and reads it
// back, failing the test otherwise.
func echoTunnel(t *testing.T, env []string, bc, node string) func(what string) {
	t.Helper()
	pf := testenv.Start(t, env, bc, "nodes", "port-forward", node, fmt.Sprintf("0:%d", echoServer(t)))
	local := pf.WaitLine(`Forwarding (127\.0\.0\.1:\d+) ->`, 30*time.Second)[1]
	tunnel, err := net.DialTimeout("tcp", local, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tunnel.Close() })
	r := bufio.NewReader(tunnel)
	return func(what string) {
		t.Helper()
		msg := "through the tunnel " + what + "\n"
		if _, err := tunnel.Write([]byte(msg)); err != nil {
			t.Fatalf("tunnel %s: %v", what, err)
		}
		tunnel.SetReadDeadline(time.Now().Add(10 * time.Second))
		if got, err := r.ReadString('\n'); err != nil || got != msg {
			t.Fatalf("tunnel %s: read %q, %v", what, got, err)
		}
	}
}

// checkPinsGatewayCA checks that the bcd data dir dataDir of machine name
// trusts the gateway CA with pin: its identity.json's gateway_pins hold it.
func checkPinsGatewayCA(t *testing.T, name, dataDir, pin string) {
	t.Helper()
	var info struct {
		GatewayPins []string `json:"gateway_pins"`
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dataDir, "identity.json"))), &info); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(info.GatewayPins, pin) {
		t.Errorf("%s: identity.json pins %v, want the new gateway CA %s among them", name, info.GatewayPins, pin)
	}
}
