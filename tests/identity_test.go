package tests

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// These tests follow a node's identity over time with real processes, on
// both store backends (DESIGN.md, "Identity over time"; issue 14's "Done
// when"). Lifetimes are compressed: node certificates live 10 s.

// shortCertTTL is the node certificate life of these deployments.
const shortCertTTL = 10 * time.Second

// shortCerts configures a deployment to issue shortCertTTL certificates.
var shortCerts = deploymentConfig{gateway: fmt.Sprintf("    nodeCertTTL: %s\n", shortCertTTL)}

// bcd node's log lines these tests wait on or count.
var (
	sessionEstablishedID = `msg="Session established" .*session_id=(\S+)`
	certRenewed          = regexp.MustCompile(`msg="Node certificate renewed"`)
	renewFailed          = regexp.MustCompile(`msg="Node certificate renewal failed"`)
	sessionEnded         = regexp.MustCompile(`msg="Session with gateway ended`)
)

// joinedAs is bcd join's line naming the node, whichever way it joined
// ("Joined as node ID (...)"); a second line says when it re-joined
// ("Node ID kept its id, ...") or was recognised as a retry ("... no
// further token use.").
var joinedAs = regexp.MustCompile(`as node (\S+) \(`)

// TestIdentityRenewalsKeepOneSession: a bcd node with a 10 s certificate
// keeps one session for 70 s: at least 5 renewals (bcd's log and node.renew
// audit rows), the same session id in the gateway's sessions row
// throughout, no reconnect, and a certificate still valid at the end.
func TestIdentityRenewalsKeepOneSession(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		d := newDeploymentWith(t, backend, shortCerts)
		tokenFile, _ := d.joinToken(1, time.Hour)
		m := newMachine(t, "renew-01")
		id := m.mustJoin(d.gatewayURL, tokenFile)
		p := m.node()
		sid := p.WaitLine(sessionEstablishedID, 30*time.Second)[1]
		var first *store.Session
		eventually(t, 10*time.Second, func() bool {
			s, err := d.st.SessionGet(ctx, id)
			first = s
			return err == nil && s.SessionID == sid
		}, func() string { return fmt.Sprintf("no sessions row with bcd's session %s: %+v", sid, first) })

		// 70 s, checked every second: the same session row, bcd running.
		const hold = 70 * time.Second
		start := time.Now()
		for time.Since(start) < hold {
			select {
			case <-p.Done():
				t.Fatalf("bcd node exited after %v: %s", time.Since(start).Round(time.Second), p.Output())
			case <-time.After(time.Second):
			}
			s, err := d.st.SessionGet(ctx, id)
			if err != nil || s.SessionID != first.SessionID || s.Epoch != first.Epoch || s.GatewayID != first.GatewayID {
				t.Fatalf("after %v the node's sessions row is %+v (%v), want session %s epoch %d on %s throughout",
					time.Since(start).Round(time.Second), s, err, first.SessionID, first.Epoch, first.GatewayID)
			}
		}

		renewed := countLines(p, certRenewed)
		audited := 0
		for _, e := range auditRows(t, d, admission.ActionRenew) {
			if e.Resource == "node/"+id && e.Outcome == admission.OutcomeSuccess {
				audited++
			}
		}
		t.Logf("%s: %d renewals in bcd's log, %d node.renew audit rows in %v on session %s", backend, renewed, audited, hold, sid)
		if renewed < 5 || audited < 5 {
			t.Fatalf("in %v with a %v certificate: %d renewals in bcd's log and %d successful node.renew audit rows, want at least 5 each",
				hold, shortCertTTL, renewed, audited)
		}
		if n := countLines(p, sessionEstablished); n != 1 {
			t.Fatalf("bcd established %d sessions in %v, want 1 (no reconnect)", n, hold)
		}
		if n, f := countLines(p, sessionEnded), countLines(p, renewFailed); n != 0 || f != 0 {
			t.Fatalf("bcd logged %d ended sessions and %d failed renewals, want none", n, f)
		}
		// The certificate bcd stored and the one the API shows are current.
		if na := nodeCertNotAfter(t, m); time.Until(na) <= 0 {
			t.Fatalf("node.crt in the data dir expired at %v", na)
		}
		var n struct {
			State          string    `json:"state"`
			GatewayID      string    `json:"gatewayId"`
			CertExpireTime time.Time `json:"certExpireTime"`
		}
		d.cliJSON(&n, d.viaAPI("nodes", "get", id)...)
		if n.State != "ready" || n.GatewayID != first.GatewayID || !n.CertExpireTime.After(start.Add(hold)) {
			t.Fatalf("nodes get %s: %+v; want ready on %s with a certificate renewed during the %v", id, n, first.GatewayID, hold)
		}
	})
}

// TestIdentityOutage stops the control plane for three certificate
// lifetimes and starts it again. Within pki.reattestGrace the node comes
// back by itself: bcd keeps running, says how long it has left, re-attests
// (a node.reattested audit row) and opens a new session. With a grace
// shorter than the outage bcd exits 4 with the re-join command, and that
// command brings the node back as itself.
func TestIdentityOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		grace time.Duration // 0: the default (7 days)
	}{
		{"within-grace", 0},
		{"grace-passed", 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, backend string) {
				ctx := context.Background()
				cfg := shortCerts
				if tc.grace > 0 {
					cfg.top = fmt.Sprintf("pki:\n  reattestGrace: %s\n", tc.grace)
				}
				d := newDeploymentWith(t, backend, cfg)
				tokenFile, _ := d.joinToken(1, time.Hour)
				m := newMachine(t, "outage-01")
				id := m.mustJoin(d.gatewayURL, tokenFile)
				p := m.node()
				sid := p.WaitLine(sessionEstablishedID, 30*time.Second)[1]
				eventually(t, 10*time.Second, func() bool {
					s, err := d.st.SessionGet(ctx, id)
					return err == nil && s.SessionID == sid
				}, func() string { return "no sessions row for the node" })

				d.serve.Stop(syscall.SIGTERM, 30*time.Second)
				stopped := time.Now()
				// bcd notices that its certificate expired while the
				// gateway is away, keeps trying and says how long it has.
				left := p.WaitLine(`msg="Node certificate expired: re-attesting with the node's key" .*reattest_left=(\S+)`, 90*time.Second)[1]
				if tc.grace == 0 && (left == "0s" || left == "unknown") {
					t.Fatalf("bcd says %s left to re-attest within the default grace of 7 days", left)
				}
				// The outage itself: three certificate lifetimes.
				time.Sleep(time.Until(stopped.Add(3 * shortCertTTL)))
				select {
				case <-p.Done():
					t.Fatalf("bcd node exited during the outage (exit %d), want it to keep retrying", p.Wait(time.Second))
				default:
				}
				restarted := time.Now()
				d.start()
				t.Logf("%s: serve back after %v", backend, restarted.Sub(stopped).Round(time.Second))

				if tc.grace == 0 {
					p.WaitLine(`msg="Node certificate re-attested"`, 120*time.Second)
					eventually(t, 60*time.Second, func() bool { return countLines(p, sessionEstablished) >= 2 },
						func() string { return "bcd did not establish a session after the re-attestation" })
					t.Logf("%s: node back %v after serve restarted", backend, time.Since(restarted).Round(time.Second))
					var s *store.Session
					eventually(t, 10*time.Second, func() bool {
						var err error
						s, err = d.st.SessionGet(ctx, id)
						return err == nil && s.SessionID != sid
					}, func() string {
						return fmt.Sprintf("the node's sessions row after the outage: %+v, want a new session", s)
					})
					wantAudit(t, d, admission.ActionReattest, id, admission.OutcomeSuccess)
					eventually(t, 10*time.Second, func() bool { return d.nodes()[id].State == "ready" },
						func() string { return fmt.Sprintf("node %s not ready after the outage: %+v", id, d.nodes()[id]) })
					if na := nodeCertNotAfter(t, m); !na.After(restarted) {
						t.Fatalf("node.crt after the re-attestation expires at %v, before serve restarted", na)
					}
					return
				}

				// The grace passed: exit 4 with the command that brings the
				// node back, and no earlier.
				if code := p.Wait(120 * time.Second); code != 4 {
					t.Fatalf("bcd node after an outage longer than pki.reattestGrace exited %d, want 4:\n%s", code, p.Output())
				}
				wantAudit(t, d, admission.ActionReattest, id, admission.OutcomeRefused)
				reinstall := "better-compute nodes reinstall " + id + " --out token"
				rejoin := "bcd join --gateway " + d.gatewayURL + " --token-file token --force"
				final := p.WaitLine(`^bcd: .*`, time.Second)[0]
				if !strings.Contains(final, reinstall) || !strings.Contains(final, rejoin) {
					t.Fatalf("bcd's last words %q, want the commands %q and %q", final, reinstall, rejoin)
				}
				// Following them brings the node back as itself.
				token := filepath.Join(t.TempDir(), "token")
				d.cli(d.viaAPI("nodes", "reinstall", id, "--out", token)...)
				code, stdout, stderr := m.joinWith(d.gatewayURL, token, "--force")
				t.Logf("%s: the re-join command: exit %d, stdout %q, stderr %q", backend, code, stdout, stderr)
				if mt := joinedAs.FindStringSubmatch(stdout); code != 0 || mt == nil || mt[1] != id {
					t.Fatalf("the re-join command bcd gave: exit %d\n%s%s; want node %s", code, stdout, stderr, id)
				}
				again := m.node()
				again.WaitLine(sessionEstablishedID+` node_id=`+id, 30*time.Second)
			})
		})
	}
}

// TestIdentityLostJoinReply: a Join whose reply is lost (a proxy forwards
// the request and drops the gateway's answer) fails; retried against the
// gateway with the same data dir (the same key) it gets the node the lost
// reply made, and the token (max-uses 1) stays at one use; another key is
// refused.
func TestIdentityLostJoinReply(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		d := newDeployment(t, backend)
		tokenFile, tokenID := d.joinToken(1, time.Hour)
		proxy := startReplyDropper(t, d.gwAddr)
		m := newMachine(t, "lost-reply")

		code, stdout, stderr := m.join("https://"+net.JoinHostPort("localhost", proxy.port()), tokenFile)
		if code != 1 || !strings.HasPrefix(stderr, "bcd: ") {
			t.Fatalf("bcd join through the proxy that loses the answer: exit %d\n%s%s; want exit 1 with the error", code, stdout, stderr)
		}
		if proxy.lost.Load() == 0 {
			t.Fatalf("the proxy dropped no answer of the gateway; bcd join said %q", stderr)
		}
		if m.joined() {
			t.Fatal("bcd join wrote an identity without the gateway's answer")
		}
		if fi, err := os.Stat(filepath.Join(m.dataDir, "node.key")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("the join key after a failed join: %v (%v), want node.key kept, mode 0600", fi, err)
		}
		// The request reached the gateway: the token is spent on a node.
		if tok, err := d.st.JoinTokenGet(ctx, tokenID); err != nil || tok.Uses != 1 {
			t.Fatalf("token after the lost answer: %+v (%v), want 1 use", tok, err)
		}
		lost := nodesNamed(t, d, m.name)
		if len(lost) != 1 {
			t.Fatalf("nodes named %s after the lost answer: %v, want 1", m.name, lost)
		}

		// The retry, straight to the gateway, with the same data dir.
		code, stdout, stderr = m.join(d.gatewayURL, tokenFile)
		mt := joinedAs.FindStringSubmatch(stdout)
		if code != 0 || mt == nil || !strings.Contains(stdout, "no further token use") {
			t.Fatalf("retried bcd join: exit %d\n%s%s; want the gateway to recognise the retry", code, stdout, stderr)
		}
		if mt[1] != lost[0] {
			t.Fatalf("retried join got node %s, want %s, which the lost answer made", mt[1], lost[0])
		}
		if tok, err := d.st.JoinTokenGet(ctx, tokenID); err != nil || tok.Uses != 1 {
			t.Fatalf("token after the retry: %+v (%v), want still 1 use", tok, err)
		}
		if got := nodesNamed(t, d, m.name); len(got) != 1 {
			t.Fatalf("nodes named %s after the retry: %v, want only %s", m.name, got, lost[0])
		}
		m.node().WaitLine(sessionEstablishedID+` node_id=`+lost[0], 30*time.Second)

		// Another key (a fresh data dir) with the token: used up.
		other := newMachine(t, "lost-reply-other")
		code, stdout, stderr = other.join(d.gatewayURL, tokenFile)
		if code != 1 || !strings.Contains(stderr, "join token used up") || other.joined() {
			t.Fatalf("a join with another key on the spent token: exit %d\n%s%s; want exit 1, \"join token used up\"", code, stdout, stderr)
		}
		if tok, err := d.st.JoinTokenGet(ctx, tokenID); err != nil || tok.Uses != 1 {
			t.Fatalf("token after the refused join: %+v (%v), want still 1 use", tok, err)
		}
	})
}

// TestIdentitySameHostname: a second machine (its own UTS namespace and
// machine-id) with the hostname of a live node joins as a new node, with a
// warning, and the first node's session stays up. Then nodes reinstall and
// a join from a wiped data dir take the first node's id, labels and
// command history.
func TestIdentitySameHostname(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		d := newDeployment(t, backend)
		tokenFile, _ := d.joinToken(2, time.Hour)
		first := newMachine(t, "twin")
		code, stdout, stderr := first.joinWith(d.gatewayURL, tokenFile, "--label", "rack=r7")
		mt := joinedAs.FindStringSubmatch(stdout)
		if code != 0 || mt == nil {
			t.Fatalf("bcd join on the first machine: exit %d\n%s%s", code, stdout, stderr)
		}
		firstID := mt[1]
		firstNode := first.node()
		firstSID := firstNode.WaitLine(sessionEstablishedID, 30*time.Second)[1]
		eventually(t, 10*time.Second, func() bool {
			s, err := d.st.SessionGet(ctx, firstID)
			return err == nil && s.SessionID == firstSID
		}, func() string { return "no sessions row for the first node" })

		// Another machine, the same hostname.
		second := newMachine(t, "twin")
		if first.idFile == second.idFile {
			t.Fatal("the two machines share a machine-id file")
		}
		code, stdout, stderr = second.join(d.gatewayURL, tokenFile)
		mt = joinedAs.FindStringSubmatch(stdout)
		if code != 0 || mt == nil {
			t.Fatalf("bcd join on the second machine: exit %d\n%s%s", code, stdout, stderr)
		}
		secondID := mt[1]
		if secondID == firstID || strings.Contains(stdout, "kept its id") {
			t.Fatalf("a machine with only the hostname in common joined as %s (%q), want a new node, not %s", secondID, stdout, firstID)
		}
		warning := regexp.MustCompile(`(?m)^warning: node ` + firstID + ` .*hostname "twin".*new node`)
		if !warning.MatchString(stderr) {
			t.Fatalf("bcd join of the second twin printed %q on stderr, want a warning that node %s has hostname twin", stderr, firstID)
		}
		secondNode := second.node()
		secondSID := secondNode.WaitLine(sessionEstablishedID+` node_id=`+secondID, 30*time.Second)[1]
		eventually(t, 10*time.Second, func() bool {
			n := d.nodes()
			return n[firstID].State == "ready" && n[secondID].State == "ready"
		}, func() string { return fmt.Sprintf("both twins not ready: %+v", d.nodes()) })
		// The first node's session was never touched.
		if s, err := d.st.SessionGet(ctx, firstID); err != nil || s.SessionID != firstSID {
			t.Fatalf("the first node's session after its twin joined: %+v (%v), want %s", s, err, firstSID)
		}
		if n := countLines(firstNode, sessionEstablished); n != 1 || countLines(firstNode, sessionEnded) != 0 {
			t.Fatalf("the first node's bcd established %d sessions (or lost one) after its twin joined, want its one session", n)
		}
		if revs, err := d.st.RevocationList(ctx, time.Time{}); err != nil || len(revs) != 0 {
			t.Fatalf("revocations after a twin joined: %+v (%v), want none", revs, err)
		}

		// History on the first node, then the machine is wiped.
		cmdID := d.runNoWait(firstID, nil, "echo", "before-reinstall")
		eventually(t, 30*time.Second, func() bool { return d.command(cmdID).State == "succeeded" },
			func() string { return fmt.Sprintf("command %s: %+v", cmdID, d.command(cmdID)) })
		oldSerial := nodeSerial(t, d, firstID)
		firstNode.Stop(syscall.SIGTERM, 10*time.Second)
		if err := os.RemoveAll(first.dataDir); err != nil {
			t.Fatal(err)
		}
		token := filepath.Join(t.TempDir(), "reinstall-token")
		out := d.cli(d.viaAPI("nodes", "reinstall", firstID, "--out", token)...)
		if !strings.Contains(out, firstID) || !strings.Contains(out, "bcd join --gateway "+d.gatewayURL+" --token-file "+token) {
			t.Fatalf("nodes reinstall printed %q, want the node and the join command", out)
		}
		code, stdout, stderr = first.join(d.gatewayURL, token)
		mt = joinedAs.FindStringSubmatch(stdout)
		if code != 0 || mt == nil || mt[1] != firstID || !strings.Contains(stdout, "Node "+firstID+" kept its id") {
			t.Fatalf("bcd join of the wiped machine with the reinstall token: exit %d\n%s%s; want re-joined as %s", code, stdout, stderr, firstID)
		}
		first.node().WaitLine(sessionEstablishedID+` node_id=`+firstID, 30*time.Second)

		var got struct {
			ID       string            `json:"id"`
			Hostname string            `json:"hostname"`
			Labels   map[string]string `json:"labels"`
		}
		d.cliJSON(&got, d.viaAPI("nodes", "get", firstID)...)
		if got.ID != firstID || got.Hostname != "twin" || got.Labels["rack"] != "r7" {
			t.Fatalf("nodes get %s after the reinstall: %+v, want hostname twin and label rack=r7", firstID, got)
		}
		var list struct {
			Commands []struct {
				ID string `json:"id"`
			} `json:"commands"`
		}
		d.cliJSON(&list, d.viaAPI("commands", "list", "--node", firstID)...)
		if len(list.Commands) != 1 || list.Commands[0].ID != cmdID {
			t.Fatalf("commands list --node %s after the reinstall: %+v, want %s", firstID, list.Commands, cmdID)
		}
		if c := d.command(cmdID); c.NodeID != firstID || c.State != "succeeded" || strings.TrimSpace(string(c.Stdout)) != "before-reinstall" {
			t.Fatalf("commands get %s after the reinstall: %+v", cmdID, c)
		}
		revs, err := d.st.RevocationList(ctx, time.Time{})
		if err != nil || len(revs) != 1 || revs[0].Serial != oldSerial || revs[0].Reason != admission.RevokeReasonReinstall {
			t.Fatalf("revocations after the reinstall: %+v (%v), want the wiped machine's certificate %s (reinstall)", revs, err, oldSerial)
		}
		// The twin kept its session through it all; the token is spent.
		if s, err := d.st.SessionGet(ctx, secondID); err != nil || s.SessionID != secondSID {
			t.Fatalf("the twin's session after the reinstall: %+v (%v), want %s", s, err, secondSID)
		}
		third := newMachine(t, "twin")
		if code, stdout, stderr := third.join(d.gatewayURL, token); code != 1 || !strings.Contains(stderr, "join token used up") {
			t.Fatalf("a second join with the reinstall token: exit %d\n%s%s; want \"join token used up\"", code, stdout, stderr)
		}
	})
}

// joinWith runs bcd join on m with extra flags and returns its exit code,
// stdout and stderr.
func (m *machine) joinWith(gatewayURL, tokenFile string, extra ...string) (int, string, string) {
	m.t.Helper()
	bin, args := m.argv(append([]string{"join", "--gateway", gatewayURL, "--token-file", tokenFile, "--data-dir", m.dataDir}, extra...)...)
	return testenv.Run(m.t, nil, "", bin, args...)
}

// nodeCertNotAfter reads the end of validity of the certificate in m's
// data dir.
func nodeCertNotAfter(t *testing.T, m *machine) time.Time {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.dataDir, "node.crt"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("node.crt holds no PEM block")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.NotAfter
}

// nodesNamed returns the ids of d's nodes with hostname name.
func nodesNamed(t *testing.T, d *deployment, name string) []string {
	t.Helper()
	var ids []string
	for id, n := range d.nodes() {
		if n.Hostname == name {
			ids = append(ids, id)
		}
	}
	return ids
}

// nodeSerial is the serial of a node's current certificate.
func nodeSerial(t *testing.T, d *deployment, id string) string {
	t.Helper()
	n, err := d.st.NodeGet(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n.CertSerial
}

// auditRows returns d's audit rows of action.
func auditRows(t *testing.T, d *deployment, action string) []*store.AuditEntry {
	t.Helper()
	var out []*store.AuditEntry
	var after int64
	for {
		page, err := d.st.AuditList(context.Background(), after, store.MaxListLimit)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			if e.Action == action {
				out = append(out, e)
			}
		}
		if len(page) < store.MaxListLimit {
			return out
		}
		after = page[len(page)-1].ID
	}
}

// wantAudit waits for an audit row of action on node id with outcome.
func wantAudit(t *testing.T, d *deployment, action, id, outcome string) {
	t.Helper()
	var seen []string
	eventually(t, 10*time.Second, func() bool {
		seen = seen[:0]
		for _, e := range auditRows(t, d, action) {
			seen = append(seen, fmt.Sprintf("%s %s %s", e.Resource, e.Outcome, e.Details))
			if e.Resource == "node/"+id && e.Outcome == outcome {
				return true
			}
		}
		return false
	}, func() string {
		return fmt.Sprintf("no %s %s audit row for node %s; %s rows: %v", outcome, action, id, action, seen)
	})
}

// replyDropper is a TCP proxy to a gateway that loses the answer to a
// join: TLS record headers are plaintext, so once the client has sent an
// application-data record (type 23) of at least joinRecordMin bytes (the
// Join request; the handshake's Finished and HTTP/2's preface and
// settings are smaller), it forwards nothing more from the gateway and
// closes both sides once the gateway has sent answerMin bytes (the answer,
// which carries certificates) or after answerWait.
type replyDropper struct {
	t    *testing.T
	ln   net.Listener
	to   string
	lost atomic.Int32 // connections whose answer was dropped
}

const (
	joinRecordMin = 300
	answerMin     = 1000
	answerWait    = 5 * time.Second
)

// startReplyDropper listens on a loopback port and proxies to addr until
// the test ends.
func startReplyDropper(t *testing.T, addr string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{t: t, ln: ln, to: addr}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.proxy(c) })
		}
	})
	return p
}

func (p *replyDropper) port() string {
	_, port, _ := net.SplitHostPort(p.ln.Addr().String())
	return port
}

func (p *replyDropper) proxy(c net.Conn) {
	s, err := net.Dial("tcp", p.to)
	if err != nil {
		p.t.Logf("reply dropper: dial %s: %v", p.to, err)
		c.Close()
		return
	}
	var dropping atomic.Bool
	closeBoth := sync.OnceFunc(func() {
		c.Close()
		s.Close()
	})
	defer closeBoth()
	var wg sync.WaitGroup
	defer wg.Wait()
	// Client to gateway, record by record.
	wg.Go(func() {
		defer closeBoth()
		for {
			rec := make([]byte, 5)
			if _, err := io.ReadFull(c, rec); err != nil {
				return
			}
			n := int(binary.BigEndian.Uint16(rec[3:5]))
			rec = append(rec, make([]byte, n)...)
			if _, err := io.ReadFull(c, rec[5:]); err != nil {
				return
			}
			if rec[0] == 23 && n >= joinRecordMin && dropping.CompareAndSwap(false, true) {
				p.t.Logf("reply dropper: the client sent a %d-byte record; dropping the gateway's answer", n)
				time.AfterFunc(answerWait, closeBoth)
			}
			if _, err := s.Write(rec); err != nil {
				return
			}
		}
	})
	// Gateway to client, until the request went by.
	buf := make([]byte, 32<<10)
	dropped := 0
	for {
		n, err := s.Read(buf)
		if n > 0 && dropping.Load() {
			dropped += n
			if dropped >= answerMin {
				p.t.Logf("reply dropper: dropped %d bytes of the gateway's answer; closing", dropped)
				p.lost.Add(1)
				return
			}
		} else if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if dropping.Load() && !errors.Is(err, net.ErrClosed) {
				p.t.Logf("reply dropper: gateway side ended after %d dropped bytes: %v", dropped, err)
			}
			return
		}
	}
}
