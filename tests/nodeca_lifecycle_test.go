package tests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// These tests follow nodes through node-CA rotations with real processes
// (serve with every role, real bcd), on both store backends, with
// compressed lifetimes (DESIGN.md, "CA rotation" and "Identity over time";
// issue 34's "Done when"): a node that slept through a rotation, a node
// that joined while one propagated, and rollbacks from propagating and
// from activated.

// bcd node's log lines of a node whose certificate's issuer the gateway no
// longer trusts.
var (
	issuerRefused = regexp.MustCompile(`msg="Node certificate's issuer not trusted by the gateway: re-attesting with the node's key"`)
	reattested    = regexp.MustCompile(`msg="Node certificate re-attested"`)
)

// rotation reads `pki rotate node-ca status -o json`.
func (d *deployment) rotation() rotationView {
	d.t.Helper()
	var v rotationView
	d.cliJSON(&v, d.viaAPI("pki", "rotate", "node-ca", "status")...)
	return v
}

// rotationPhase is the first line of `pki rotate node-ca status`.
func (d *deployment) rotationPhase() string {
	d.t.Helper()
	return strings.SplitN(d.cli(d.viaAPI("pki", "rotate", "node-ca", "status")...), "\n", 2)[0]
}

// rotate runs `pki rotate node-ca ARGS -o json` and returns its rotation.
func (d *deployment) rotate(args ...string) rotationView {
	d.t.Helper()
	var v rotationView
	d.cliJSON(&v, d.viaAPI(append([]string{"pki", "rotate", "node-ca"}, args...)...)...)
	return v
}

// waitPhase waits until the rotation's status says phase on its first line.
func (d *deployment) waitPhase(phase string, timeout time.Duration) {
	d.t.Helper()
	eventually(d.t, timeout, func() bool { return d.rotationPhase() == phase },
		func() string { return fmt.Sprintf("status never said %s: %+v", phase, d.rotation().Rotation) })
}

// rootsReloaded is the gateway's line for node CA roots it reloaded from
// the bundle in the database.
var rootsReloaded = regexp.MustCompile(`msg="Node CA roots reloaded" .*roots=(\d+) issuer=(\S+)`)

// waitRoots waits until serve's gateway has reloaded the bundle of a phase
// change: its latest reload trusts n roots and issues from issuer. The
// database changes at once; handshakes and joins follow within a second.
func (d *deployment) waitRoots(n int, issuer string) {
	d.t.Helper()
	var last []string
	eventually(d.t, 15*time.Second, func() bool {
		all := rootsReloaded.FindAllStringSubmatch(d.serve.Output(), -1)
		if len(all) == 0 {
			return false
		}
		last = all[len(all)-1]
		return last[1] == fmt.Sprint(n) && last[2] == issuer
	}, func() string {
		return fmt.Sprintf("the gateway never reloaded %d roots issuing from %s; its latest reload: %q", n, issuer, last)
	})
}

// nodeCARootIDs are the ids of the node CA roots in m's node-ca.crt.
func nodeCARootIDs(t *testing.T, m *machine) []string {
	t.Helper()
	var ids []string
	for _, r := range readCertsPEM(t, m, "node-ca.crt") {
		ids = append(ids, pki.NodeCAID(r))
	}
	return ids
}

// nodeSerialOnDisk is the serial of the certificate in m's data dir.
func nodeSerialOnDisk(t *testing.T, m *machine) string {
	t.Helper()
	return pki.FormatSerial(readCertsPEM(t, m, "node.crt")[0].SerialNumber)
}

// issuedBy reports whether the certificate in m's data dir was signed by
// the node CA root with id caID among roots.
func issuedBy(t *testing.T, m *machine, roots []*x509.Certificate, caID string) bool {
	t.Helper()
	leaf := readCertsPEM(t, m, "node.crt")[0]
	for _, r := range roots {
		if pki.NodeCAID(r) == caID {
			return leaf.CheckSignatureFrom(r) == nil
		}
	}
	t.Fatalf("no root %s among the roots given", caID)
	return false
}

// nodeRoots are the node CA roots of d's bundle in force, with the
// rotation's new root while one propagates.
func nodeRoots(t *testing.T, d *deployment) []*x509.Certificate {
	t.Helper()
	b, err := bootstrap.LoadBundle(context.Background(), d.st, d.secret())
	if err != nil {
		t.Fatal(err)
	}
	return b.NodeCARoots()
}

// holdSilentSession opens a session with m's identity (read from its data dir,
// with no bcd running on it) that says Hello and then never reads or acks
// anything: a live node that does not acknowledge a rotation's bundle, as
// an older bcd would not. It ends when the returned function is called.
func holdSilentSession(t *testing.T, d *deployment, m *machine) (end func()) {
	t.Helper()
	b, err := bootstrap.LoadBundle(context.Background(), d.st, d.secret())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(m.dataDir, "node.crt"), filepath.Join(m.dataDir, "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cc := d.dial(t, b, &cert)
	end = func() { cancel(); cc.Close() }
	t.Cleanup(end)
	stream, err := sessionv1.NewSessionServiceClient(cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Hello{Hello: &sessionv1.Hello{
		BcdVersion: "0.0.0-e2e", Os: runtime.GOOS, Arch: runtime.GOARCH}}}); err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil || msg.GetWelcome() == nil {
		t.Fatalf("session of %s: first answer %v (%v), want Welcome", m.name, msg, err)
	}
	return end
}

// TestNodeCASleptThrough: two nodes sleep through a rotation and are
// started after the old CA retired (the reconciler retires it once
// pki.reattestGrace, 2 s here, has passed since activation). The first
// joins while the rotation propagates (the old CA still issues), just
// before the operator activates it, and is not started, so its 25 s
// certificate need outlast only activation and retirement, and no session
// of it can let the reconciler activate first. Its certificate from the
// retired CA still valid, it is refused in the
// handshake (unknown CA), re-attests with its key without an operator and
// comes back as itself on a certificate of the new CA (read from its data
// dir). The second is started after its certificate expired longer ago than
// the grace: re-attestation is refused, and bcd exits 4 saying how to
// re-join; following that brings it back as itself, on the new CA.
func TestNodeCASleptThrough(t *testing.T) {
	t.Parallel()
	const certTTL, grace = 25 * time.Second, 2 * time.Second
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		d := newDeploymentWith(t, backend, deploymentConfig{
			gateway: fmt.Sprintf("    nodeCertTTL: %s\n", certTTL),
			top:     fmt.Sprintf("pki:\n  reattestGrace: %s\n", grace),
		})
		tokenFile, _ := d.joinToken(2, time.Hour)
		early, late := newMachine(t, "slept-01"), newMachine(t, "slept-02")
		lateID := late.mustJoin(d.gatewayURL, tokenFile)
		p := late.node()
		p.WaitLine(sessionEstablishedID, 30*time.Second)
		p.Stop(syscall.SIGTERM, 10*time.Second)
		lateNotAfter := nodeCertNotAfter(t, late)

		v := d.rotate("start", "--reason", "test")
		oldCA, newCA := v.Rotation.OldCAID, v.Rotation.NewCAID
		roots := nodeRoots(t, d) // old and new
		d.waitRoots(2, oldCA)
		earlyID := early.mustJoin(d.gatewayURL, tokenFile)
		if !issuedBy(t, early, roots, oldCA) {
			t.Fatalf("%s: a node joined while propagating holds no certificate of the old CA", backend)
		}
		// No live node acknowledges anything: the operator activates.
		if v = d.rotate("advance", "--force", "--reason", "test"); v.Rotation.Phase != "activated" {
			t.Fatalf("advance --force: %+v, want activated", v.Rotation)
		}
		d.waitPhase("retired", 30*time.Second)
		d.waitRoots(1, newCA)
		if !issuedBy(t, early, roots, oldCA) || time.Until(nodeCertNotAfter(t, early)) <= 0 {
			t.Fatalf("%s: the node's certificate is not a valid one of the old CA at retirement; the test's timing is off", backend)
		}

		// Within the grace: back on the new CA by itself.
		p = early.node()
		p.WaitLine(sessionEstablishedID+` node_id=`+earlyID, 60*time.Second)
		if countLines(p, issuerRefused) != 1 || countLines(p, reattested) != 1 {
			t.Fatalf("bcd did not re-attest once for a refused issuer:\n%s", p.Output())
		}
		if !issuedBy(t, early, roots, newCA) {
			t.Fatalf("the certificate in the data dir after re-attestation is not from the new CA %s", newCA)
		}
		wantAudit(t, d, admission.ActionReattest, earlyID, admission.OutcomeSuccess)
		if n, err := d.st.NodeGet(ctx, earlyID); err != nil || n.CertSerial != nodeSerialOnDisk(t, early) {
			t.Fatalf("node %s after re-attestation: %+v (%v), want the serial in its data dir", earlyID, n, err)
		}

		// After the grace: refused, with the way back.
		eventually(t, certTTL+grace+30*time.Second, func() bool { return time.Since(lateNotAfter) > grace+time.Second },
			func() string { return "the grace never passed" })
		p = late.node()
		if code := p.Wait(60 * time.Second); code != 4 {
			t.Fatalf("bcd node started after the grace exited %d, want 4:\n%s", code, p.Output())
		}
		wantAudit(t, d, admission.ActionReattest, lateID, admission.OutcomeRefused)
		reinstall := "better-compute nodes reinstall " + lateID + " --out token"
		rejoin := "bcd join --gateway " + d.gatewayURL + " --token-file token --force"
		final := p.WaitLine(`^bcd: .*`, time.Second)[0]
		if !strings.Contains(final, reinstall) || !strings.Contains(final, rejoin) {
			t.Fatalf("bcd's last words %q, want the commands %q and %q", final, reinstall, rejoin)
		}
		token := filepath.Join(t.TempDir(), "token")
		d.cli(d.viaAPI("nodes", "reinstall", lateID, "--out", token)...)
		code, stdout, stderr := late.joinWith(d.gatewayURL, token, "--force")
		if mt := joinedAs.FindStringSubmatch(stdout); code != 0 || mt == nil || mt[1] != lateID {
			t.Fatalf("the re-join command bcd gave: exit %d\n%s%s; want node %s", code, stdout, stderr, lateID)
		}
		if !issuedBy(t, late, roots, newCA) {
			t.Fatalf("the re-joined node's certificate is not from the new CA %s", newCA)
		}
		late.node().WaitLine(sessionEstablishedID+` node_id=`+lateID, 30*time.Second)
	})
}

// TestNodeCAJoinWhilePropagating: a node joins while a rotation
// propagates (no live node yet, so it stays propagating). Its first
// certificate comes from the old CA with both roots beside it; its session
// acknowledges the bundle, the reconciler activates, its next renewal
// brings a certificate from the new CA, and the rotation retires, on one
// session throughout.
func TestNodeCAJoinWhilePropagating(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		d := newDeploymentWith(t, backend, shortCerts)
		v := d.rotate("start", "--reason", "test")
		oldCA, newCA := v.Rotation.OldCAID, v.Rotation.NewCAID
		roots := nodeRoots(t, d)
		d.waitRoots(2, oldCA)

		tokenFile, _ := d.joinToken(1, time.Hour)
		m := newMachine(t, "propagating-01")
		id := m.mustJoin(d.gatewayURL, tokenFile)
		if !issuedBy(t, m, roots, oldCA) {
			t.Fatalf("a join while propagating got a certificate not from the old CA %s", oldCA)
		}
		if ids := nodeCARootIDs(t, m); len(ids) != 2 {
			t.Fatalf("node-ca.crt after a join while propagating holds %v, want the old and new roots %s %s", ids, oldCA, newCA)
		}
		if ph := d.rotationPhase(); ph != "propagating" {
			t.Fatalf("rotation is %s before the node's session, want propagating", ph)
		}

		p := m.node()
		p.WaitLine(sessionEstablishedID+` node_id=`+id, 30*time.Second)
		d.waitPhase("activated", 30*time.Second)
		eventually(t, 60*time.Second, func() bool { return issuedBy(t, m, roots, newCA) },
			func() string { return "the node's certificate never came from the new CA " + newCA })
		d.waitPhase("retired", 60*time.Second)
		if n := countLines(p, sessionEstablished); n != 1 {
			t.Fatalf("bcd established %d sessions, want 1", n)
		}
	})
}

// TestNodeCARollback rolls a rotation back from propagating, then a second
// one from activated, with real bcd whose certificates live 20 s, with no
// re-join or re-attestation, each node keeping its id. From propagating
// (held there by a second live node that never acknowledges), the node
// renews from the old CA on the session it had, and its roots drop the new
// one. From activated (held there by a node that never runs, whose
// certificate from the old CA is recorded valid for an hour), a node that joined meanwhile on the new CA connects with
// that certificate after the rollback (gateways keep trusting the
// rolled-back root) and its next renewal brings it back to the old CA, as
// it does the first node.
func TestNodeCARollback(t *testing.T) {
	t.Parallel()
	const certTTL = 20 * time.Second
	forEachBackend(t, func(t *testing.T, backend string) {
		d := newDeploymentWith(t, backend, deploymentConfig{gateway: fmt.Sprintf("    nodeCertTTL: %s\n", certTTL)})
		tokenFile, _ := d.joinToken(4, time.Hour)
		m, silent := newMachine(t, "rollback-01"), newMachine(t, "rollback-02")
		id := m.mustJoin(d.gatewayURL, tokenFile)
		silent.mustJoin(d.gatewayURL, tokenFile)
		p := m.node()
		p.WaitLine(sessionEstablishedID+` node_id=`+id, 30*time.Second)

		// From propagating.
		end := holdSilentSession(t, d, silent)
		v := d.rotate("start", "--reason", "test")
		oldCA, dropped := v.Rotation.OldCAID, v.Rotation.NewCAID
		eventually(t, 30*time.Second, func() bool {
			v = d.rotation()
			return v.Rotation.LiveNodes == 2 && v.Rotation.AckedNodes == 1
		}, func() string { return fmt.Sprintf("status never counted 1 of 2 acks: %+v", v.Rotation) })
		if ids := nodeCARootIDs(t, m); len(ids) != 2 {
			t.Fatalf("node-ca.crt holds %v after the ack, want the old and new roots", ids)
		}
		if v = d.rotate("rollback", "--reason", "test"); v.Rotation.Phase != "rolled-back" {
			t.Fatalf("rollback from propagating: %+v", v.Rotation)
		}
		end()
		d.waitRoots(1, oldCA)
		roots := nodeRoots(t, d)
		serial := nodeSerialOnDisk(t, m)
		eventually(t, 2*certTTL, func() bool { return nodeSerialOnDisk(t, m) != serial },
			func() string { return "the node did not renew after the rollback from propagating" })
		if !issuedBy(t, m, roots, oldCA) {
			t.Fatalf("after the rollback from propagating the node's certificate is not from the old CA %s", oldCA)
		}
		// bcd writes node.crt, then node-ca.crt (each atomically): the
		// roots follow the certificate by a moment.
		var ids []string
		eventually(t, 10*time.Second, func() bool {
			ids = nodeCARootIDs(t, m)
			return !strings.Contains(strings.Join(ids, " "), dropped)
		}, func() string {
			return fmt.Sprintf("node-ca.crt after a renewal still holds the dropped root %s: %v", dropped, ids)
		})

		// From activated. A node joined now, and never started (it cannot
		// renew), holds a certificate from the old CA, recorded valid for
		// an hour rather than its 20 s, so the reconciler cannot retire
		// the rotation before the rollback however slow the machine.
		holder := newMachine(t, "rollback-03")
		holderID := holder.mustJoin(d.gatewayURL, tokenFile)
		if err := d.st.NodeSetCertificate(context.Background(), &store.NodeSetCertificateParams{ID: holderID,
			Serial: nodeSerialOnDisk(t, holder), NotAfter: time.Now().Add(time.Hour), CAID: oldCA}); err != nil {
			t.Fatal(err)
		}
		v = d.rotate("start", "--reason", "test again")
		newCA := v.Rotation.NewCAID
		if v.Rotation.OldCAID != oldCA {
			t.Fatalf("the second rotation starts from %s, want %s", v.Rotation.OldCAID, oldCA)
		}
		roots = nodeRoots(t, d)
		d.waitPhase("activated", 30*time.Second)
		d.waitRoots(2, newCA)
		late := newMachine(t, "rollback-04")
		lateID := late.mustJoin(d.gatewayURL, tokenFile)
		if !issuedBy(t, late, roots, newCA) {
			t.Fatalf("a join while activated got a certificate not from the new CA %s", newCA)
		}
		joins := len(auditRows(t, d, admission.ActionJoin))
		if v = d.rotate("rollback", "--reason", "test"); v.Rotation.Phase != "rolled-back" {
			t.Fatalf("rollback from activated: %+v", v.Rotation)
		}
		d.waitRoots(2, oldCA) // the old CA issues; the rolled-back root stays trusted
		onNew := nodeSerialOnDisk(t, late)
		pl := late.node()
		pl.WaitLine(sessionEstablishedID+` node_id=`+lateID, 30*time.Second)
		t.Logf("%s: after the rollback from activated the node on the new CA connected (renewed first: %v)",
			backend, countLines(pl, certRenewed) > 0 || nodeSerialOnDisk(t, late) != onNew)
		for _, n := range []*machine{late, m} {
			eventually(t, 2*certTTL, func() bool { return issuedBy(t, n, roots, oldCA) },
				func() string {
					return "after the rollback from activated " + n.name + " never renewed from the old CA " + oldCA
				})
		}
		if n := countLines(p, sessionEstablished); n != 1 {
			t.Fatalf("the first node's bcd established %d sessions through both rollbacks, want 1", n)
		}
		if n := countLines(pl, sessionEstablished); n != 1 {
			t.Fatalf("the late node's bcd established %d sessions, want 1", n)
		}
		if got := len(auditRows(t, d, admission.ActionJoin)); got != joins {
			t.Fatalf("%d node.join audit rows after the rollback, %d before: a node joined again", got, joins)
		}
		if rows := auditRows(t, d, admission.ActionReattest); len(rows) != 0 {
			t.Fatalf("%d node.reattested audit rows: a node needed re-attestation", len(rows))
		}
		if ph := d.rotationPhase(); ph != "rolled-back" {
			t.Fatalf("status says %s at the end, want rolled-back", ph)
		}
	})
}
