package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/admission"
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
