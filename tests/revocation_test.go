package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// Issue 27, "Revocation is final": these tests revoke with real processes
// and check that nothing revoked comes back or stays open.

// TestRevokedNodeStaysOut: a real bcd node is revoked (pki revoke --node).
// Every way back is refused with the identity refusal REVOKED and a refused
// audit row: re-attestation once its 10 s certificate expired, bcd join
// --force with its old token, and a join retried with the same token and key
// (the lost-reply path). A token from nodes reinstall brings the machine
// back as a new node, and the revoked node stays revoked.
func TestRevokedNodeStaysOut(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, shortCerts)
	tokenFile, _ := d.joinToken(4, time.Hour)
	m := newMachine(t, "revoked-01")
	id := m.mustJoin(d.gatewayURL, tokenFile)
	p := m.node()
	p.WaitLine(sessionEstablishedID, 30*time.Second)

	d.cli(d.viaAPI("pki", "revoke", "--node", id)...)
	if code := p.Wait(30 * time.Second); code != 3 {
		t.Fatalf("bcd node after its revocation exited %d, want 3:\n%s", code, p.Output())
	}
	last := p.WaitLine(`^bcd: .*`, time.Second)[0]
	if strings.Contains(last, "join again") || !strings.Contains(last, "nodes reinstall") {
		t.Fatalf("bcd node's last words %q: want the way back (nodes reinstall), not \"join again\"", last)
	}
	revokedSerial := nodeSerial(t, d, id)

	// Re-attestation: bcd with its expired certificate proves its key.
	if wait := time.Until(nodeCertNotAfter(t, m)); wait > 0 {
		time.Sleep(wait + 500*time.Millisecond) // the certificate's own end: nothing to wait on
	}
	again := m.node()
	if code := again.Wait(60 * time.Second); code != 3 {
		t.Fatalf("bcd node with the revoked node's expired certificate exited %d, want 3 (revoked):\n%s", code, again.Output())
	}
	wantAudit(t, d, admission.ActionReattest, id, admission.OutcomeRefused)

	// bcd join --force with the old token: the proof of the node's key and
	// the token that made it.
	code, stdout, stderr := m.joinWith(d.gatewayURL, tokenFile, "--force")
	t.Logf("bcd join --force of the revoked node: exit %d\n%s%s", code, stdout, stderr)
	if code != 1 || !strings.Contains(stderr, "is revoked, and revocation is final") {
		t.Fatalf("bcd join --force of the revoked node: exit %d\n%s%s; want exit 1, revoked", code, stdout, stderr)
	}
	if strings.Contains(stderr, "join again") {
		t.Fatalf("the refusal says join again: %s", stderr)
	}

	// The same token and key without the identity (a retried join whose
	// reply was lost, as the gateway sees it).
	entries, err := os.ReadDir(m.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "node.key" {
			if err := os.RemoveAll(filepath.Join(m.dataDir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	code, stdout, stderr = m.join(d.gatewayURL, tokenFile)
	t.Logf("bcd join with the revoked node's token and key: exit %d\n%s%s", code, stdout, stderr)
	if code != 1 || !strings.Contains(stderr, "revoked") || m.joined() {
		t.Fatalf("bcd join with the revoked node's token and key: exit %d\n%s%s; want exit 1, revoked", code, stdout, stderr)
	}
	refused := 0
	for _, e := range auditRows(t, d, admission.ActionJoin) {
		var det struct {
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal(e.Details, &det)
		if e.Outcome == admission.OutcomeRefused && strings.Contains(det.Reason, "node "+id+" (certificate "+revokedSerial+") is revoked") {
			refused++
		}
	}
	if refused != 2 {
		t.Fatalf("%d refused node.join audit rows naming revoked node %s, want 2 (--force, same token and key)", refused, id)
	}
	if got := nodeSerial(t, d, id); got != revokedSerial {
		t.Fatalf("node %s's certificate is %s after the refused joins, want the revoked %s", id, got, revokedSerial)
	}

	// nodes reinstall (admin): the machine comes back as a new node.
	reinstall := filepath.Join(t.TempDir(), "reinstall-token")
	d.cli(d.viaAPI("nodes", "reinstall", id, "--out", reinstall)...)
	code, stdout, stderr = m.joinWith(d.gatewayURL, reinstall, "--force")
	t.Logf("bcd join with the reinstall token: exit %d\n%s%s", code, stdout, stderr)
	mt := joinedAs.FindStringSubmatch(stdout)
	if code != 0 || mt == nil || mt[1] == id || !strings.Contains(stderr, "joined as a new node") {
		t.Fatalf("bcd join with the reinstall token of revoked node %s: exit %d\n%s%s; want a new node, with a warning", id, code, stdout, stderr)
	}
	back := m.node()
	back.WaitLine(sessionEstablishedID+` node_id=`+mt[1], 30*time.Second)
	if got := nodeSerial(t, d, id); got != revokedSerial {
		t.Fatalf("node %s's certificate is %s after the reinstall, want the revoked %s", id, got, revokedSerial)
	}
	n, err := d.st.NodeGet(t.Context(), mt[1])
	if err != nil || n.JoinTokenID == "" {
		t.Fatalf("the new node %s: %+v, %v", mt[1], n, err)
	}
}

// TestRevocationEndsOpenCalls: on split roles (PostgreSQL) with two api
// processes, an operator's event stream and port-forward held by api 2 end
// within 5 s when the token is revoked through api 1, each CLI with one
// line saying the credential was revoked and exit 1; the forwarded
// connection closes. Then the admin's port-forward through api 2 ends the
// same way when its node is deleted through api 1.
func TestRevocationEndsOpenCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSplitDeploymentWith(t, 1, 0, internalAPIConfig(t))
	api2 := "http://" + d.start("api-2", "api").WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	m, nodeID := d.joinMachine("revoke-calls", d.gateways[0])
	bcd := m.node()
	d.waitSession(nodeID, d.gateways[0])
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bcd's output:\n%s", bcd.Output())
		}
	})
	secret, tok, err := iam.Create(ctx, d.st, iam.CreateParams{Role: store.RoleOperator, Description: "revoked while open"})
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"BETTER_COMPUTE_URL=" + api2, "BETTER_COMPUTE_TOKEN=" + secret}

	// The event stream, open once it printed an event of this node.
	watch := testenv.Start(t, env, d.bin, "events", "watch")
	eventually(t, 30*time.Second, func() bool {
		for _, m := range []string{"nodes.cordon", "nodes.uncordon"} {
			if err := d.admin.Call(ctx, m, &apiv1.NodeRequest{Id: nodeID}, &apiv1.NodeResponse{}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := watch.Await(regexp.QuoteMeta(nodeID), time.Second)
		return err == nil
	}, func() string { return "events watch never printed an event of the node:\n" + watch.Output() })

	// The port-forward, with a connection open through it.
	echo := echoServer(t)
	pf := testenv.Start(t, env, d.bin, "nodes", "port-forward", nodeID, fmt.Sprintf("0:%d", echo))
	conn := forwardedEcho(t, pf.WaitLine(`Forwarding (127\.0\.0\.1:\d+) ->`, 30*time.Second)[1])

	start := time.Now()
	if err := d.admin.Call(ctx, "tokens.revoke", &apiv1.RevokeAPITokenRequest{Id: tok.ID}, &apiv1.RevokeAPITokenResponse{}); err != nil {
		t.Fatal(err)
	}
	want := "credential revoked: API token " + tok.ID + " was revoked"
	wantEnded(t, "events watch", watch, start, want)
	wantEnded(t, "nodes port-forward", pf, start, want)
	wantConnClosed(t, conn, start)
	// The tunnel's end is recorded with the reason.
	eventually(t, 10*time.Second, func() bool {
		entries, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "tunnels.close", Actor: "token:" + tok.ID, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(entries) == 1 && strings.Contains(string(entries[0].Details), want)
	}, func() string { return "no tunnels.close audit row with the reason " + want })

	// Deleting the node ends the admin's port-forward to it.
	adminEnv := []string{"BETTER_COMPUTE_URL=" + api2, "BETTER_COMPUTE_TOKEN=" + d.admin.Token}
	pf = testenv.Start(t, adminEnv, d.bin, "nodes", "port-forward", nodeID, fmt.Sprintf("0:%d", echo))
	conn = forwardedEcho(t, pf.WaitLine(`Forwarding (127\.0\.0\.1:\d+) ->`, 30*time.Second)[1])
	start = time.Now()
	if err := d.admin.Call(ctx, "nodes.delete", &apiv1.NodeRequest{Id: nodeID}, &apiv1.NodeResponse{}); err != nil {
		t.Fatal(err)
	}
	wantEnded(t, "the admin's nodes port-forward", pf, start, "credential revoked: node "+nodeID+" was deleted")
	wantConnClosed(t, conn, start)
}

// forwardedEcho dials a port-forward to an echo server and checks one
// round trip; the connection stays open.
func forwardedEcho(t *testing.T, local string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", local, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	const msg = "through the tunnel\n"
	if _, err := conn.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := bufio.NewReader(conn).ReadString('\n'); err != nil || got != msg {
		t.Fatalf("echo through port-forward = %q, %v; want %q", got, err, msg)
	}
	return conn
}

// wantEnded checks that p exits 1 within 5 s of start with exactly one
// line holding want.
func wantEnded(t *testing.T, what string, p *testenv.Proc, start time.Time, want string) {
	t.Helper()
	code := p.Wait(30 * time.Second)
	took := time.Since(start)
	t.Logf("%s ended %v after the revocation (exit %d)", what, took.Round(time.Millisecond), code)
	if n := strings.Count(p.Output(), want); code != 1 || n != 1 || took > 5*time.Second {
		t.Fatalf("%s: exit %d after %v, %d lines holding %q; want exit 1 within 5 s, one such line:\n%s", what, code, took, n, want, p.Output())
	}
}

// wantConnClosed checks that the forwarded connection is closed by the
// far side within 5 s of start.
func wantConnClosed(t *testing.T, conn net.Conn, start time.Time) {
	t.Helper()
	conn.SetReadDeadline(start.Add(10 * time.Second))
	_, err := conn.Read(make([]byte, 1))
	took := time.Since(start)
	t.Logf("the forwarded connection closed %v after the revocation (%v)", took.Round(time.Millisecond), err)
	if err == nil || took > 5*time.Second {
		t.Fatalf("the forwarded connection: read %v after %v, want closed within 5 s", err, took)
	}
}
