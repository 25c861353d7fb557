package tests

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestNodeCAAutoRotationUnderLoad runs two full node-CA rotations back to
// back with 60 s certificates, on real processes (serve with every role,
// three real bcd), while commands flow to every node (issue 34's "Done
// when": compressed life, and a node CA of the test's own short life
// rotated by the reconciler). Node CAs live 160 s (pki.nodeCAValidity,
// also at pki init and the embedded default's first start). An operator
// starts the first rotation, as soon as serve is up and before the nodes
// join (they join while it propagates); the second nobody starts: the reconciler
// starts it once the node CA the first one made has passed half its life,
// and it is activated before that CA's last sixth. Both end retired, every
// node on the newest CA; every command submitted completes, each bcd keeps
// the one session it opened, and every node certificate seen in the data
// dirs has its full life: 60 s after its time of issue (NotBefore is
// backdated an hour), never cut short to its CA's end.
func TestNodeCAAutoRotationUnderLoad(t *testing.T) {
	t.Parallel()
	const certTTL, caLife = 60 * time.Second, 160 * time.Second
	settings := fmt.Sprintf("host:\n  gateway:\n    nodeCertTTL: %s\npki:\n  nodeCAValidity: %s\n", certTTL, caLife)
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		d := newDeploymentWith(t, backend, deploymentConfig{
			gateway: fmt.Sprintf("    nodeCertTTL: %s\n", certTTL),
			top:     fmt.Sprintf("pki:\n  nodeCAValidity: %s\n", caLife),
			pki: func(d *deployment) string {
				return initPostgresPKIWith(t, d.env, testenv.WriteFile(t, "pki-init.yaml", settings))
			},
		})
		first := nodeCAInForce(t, d)
		if got := first.NotAfter.Sub(pki.CAMadeAt(first)); got != caLife {
			t.Fatalf("the deployment's first node CA lives %s, want pki.nodeCAValidity %s", got, caLife)
		}
		// The first rotation: an operator starts it as soon as serve is
		// up, before the nodes join, so that on a loaded machine the
		// reconciler (which starts one once the first CA passes half its
		// life, 80 s after pki init) cannot come first. The nodes join
		// while it propagates: certificates from the old CA and both
		// roots, acknowledged, then the new CA at their first renewal
		// after activation.
		if left := time.Until(pki.CAMadeAt(first).Add(caLife / 2)); left < 10*time.Second {
			t.Fatalf("serve took until %s before the first node CA's half life to come up: the reconciler would start the first rotation, not the operator", left)
		}
		v := d.rotate("start", "--reason", "test")
		one := v.Rotation

		tokenFile, _ := d.joinToken(3, time.Hour)
		certs := newCertLog()
		var ms []*machine
		var ids, sids []string
		var procs []*testenv.Proc
		for i := range 3 {
			m := newMachine(t, fmt.Sprintf("auto-%02d", i+1))
			id := m.mustJoin(d.gatewayURL, tokenFile)
			certs.scan(m)
			p := m.node()
			ms, ids, procs = append(ms, m), append(ids, id), append(procs, p)
			sids = append(sids, p.WaitLine(sessionEstablishedID+` node_id=`+id, 30*time.Second)[1])
		}
		wait := func(timeout time.Duration, cond func() bool, describe func() string) {
			t.Helper()
			eventually(t, timeout, func() bool {
				for _, m := range ms {
					certs.scan(m)
				}
				return cond()
			}, describe)
		}
		load := startCommandLoad(d, ids)

		wait(2*certTTL, func() bool { return d.rotationPhase() == "retired" },
			func() string { return fmt.Sprintf("the first rotation never retired: %+v", d.rotation().Rotation) })

		// The second: the reconciler starts it when the node CA the first
		// made has passed half its life.
		second := nodeCAInForce(t, d)
		if pki.NodeCAID(second) != one.NewCAID || second.NotAfter.Sub(pki.CAMadeAt(second)) != caLife {
			t.Fatalf("after the first rotation the node CA in force is %s, living %s; want %s living %s",
				pki.NodeCAID(second), second.NotAfter.Sub(pki.CAMadeAt(second)), one.NewCAID, caLife)
		}
		var two *store.PKIRotation
		wait(time.Until(pki.CAMadeAt(second).Add(caLife/2))+30*time.Second, func() bool {
			ro, err := d.st.PKIRotationLatest(ctx, store.RotationCANode)
			if err == nil && ro.ID != one.ID {
				two = ro
			}
			return two != nil
		}, func() string { return "the reconciler never started a rotation of the node CA " + one.NewCAID })
		if two.StartedBy != rotation.ActorReconciler || two.OldCAID != one.NewCAID {
			t.Fatalf("the second rotation %+v, want one started by the reconciler from %s", two, one.NewCAID)
		}
		half, lastSixth := pki.CAMadeAt(second).Add(caLife/2), pki.CAMadeAt(second).Add(caLife/6*5)
		if two.StartedAt.Before(half.Add(-time.Second)) {
			t.Fatalf("the reconciler started rotating at %s, before the node CA's half life %s", two.StartedAt, half)
		}
		wait(2*certTTL, func() bool { return d.rotationPhase() == "retired" },
			func() string { return fmt.Sprintf("the second rotation never retired: %+v", d.rotation().Rotation) })
		two, err := d.st.PKIRotationLatest(ctx, store.RotationCANode)
		if err != nil || two.ActivatedAt == nil || !two.ActivatedAt.Before(lastSixth) {
			t.Fatalf("the second rotation %+v (%v): want it activated before the node CA's last sixth, %s", two, err, lastSixth)
		}
		starts := auditRows(t, d, rotation.AuditStarted)
		var actors []string
		for _, a := range starts {
			actors = append(actors, a.Actor)
		}
		if len(actors) != 2 || !strings.HasPrefix(actors[0], "token:") || actors[1] != rotation.ActorReconciler {
			t.Fatalf("%s audit rows by %q, want one by an operator's token, then one by the reconciler", rotation.AuditStarted, actors)
		}

		n, failed := load.stop()
		if len(failed) > 0 {
			t.Fatalf("%d of %d commands submitted during the rotations did not complete:\n%s", len(failed), n, strings.Join(failed, "\n"))
		}
		if n < 2*len(ids) {
			t.Fatalf("only %d commands ran during two rotations; the load did not flow", n)
		}
		t.Logf("%s: %d commands completed through two rotations; %d node certificates seen", backend, n, certs.count())

		for i, m := range ms {
			if !nodeIssuerIs(t, m, two.NewCAID) {
				t.Fatalf("%s does not end on the newest node CA %s", m.name, two.NewCAID)
			}
			if s, err := d.st.SessionGet(ctx, ids[i]); err != nil || s.SessionID != sids[i] {
				t.Fatalf("%s's session after two rotations: %+v (%v), want %s", m.name, s, err, sids[i])
			}
			if c := countLines(procs[i], sessionEstablished); c != 1 {
				t.Fatalf("%s's bcd established %d sessions, want 1", m.name, c)
			}
		}
		if bad := certs.shortened(certTTL); len(bad) > 0 {
			t.Fatalf("node certificates not of their full life %s:\n%s", certTTL, strings.Join(bad, "\n"))
		}
		if strings.Contains(d.serve.Output(), "Node certificate cut short") {
			t.Fatalf("the gateway cut a node certificate short to its CA's end:\n%s", d.serve.Output())
		}
		// Each node renewed at least twice: once onto each new CA.
		if c := certs.count(); c < 3*len(ms) {
			t.Fatalf("%d node certificates seen, want at least %d (a join and two renewals each)", c, 3*len(ms))
		}
	})
}

// initPostgresPKIWith is initPostgresPKI with pki init reading cfgFile (a
// node CA's life, the certificates' TTL).
func initPostgresPKIWith(t *testing.T, env []string, cfgFile string) string {
	t.Helper()
	bin := testenv.Binary(t, "better-compute")
	dir := t.TempDir()
	for _, args := range [][]string{
		{"migrate"},
		{"--config", cfgFile, "pki", "init", "--trust-domain", e2eTrustDomain},
		{"pki", "issue-gateway", "--dns", "localhost", "--ip", "127.0.0.1", "--out-dir", dir},
	} {
		if code, stdout, stderr := testenv.Run(t, env, "", bin, args...); code != 0 {
			t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
	return fmt.Sprintf("    tlsFiles:\n      cert: %s\n      key: %s\n", filepath.Join(dir, "gateway.crt"), filepath.Join(dir, "gateway.key"))
}

// nodeCAInForce is the certificate of d's issuing node CA.
func nodeCAInForce(t *testing.T, d *deployment) *x509.Certificate {
	t.Helper()
	b, err := bootstrap.LoadBundle(context.Background(), d.st, d.secret())
	if err != nil {
		t.Fatal(err)
	}
	return b.NodeCA.Cert
}

// certLog records every node certificate seen in data dirs, by serial.
type certLog struct {
	seen map[string]*x509.Certificate
	from map[string]string // serial: machine name
}

func newCertLog() *certLog {
	return &certLog{seen: map[string]*x509.Certificate{}, from: map[string]string{}}
}

// scan records the certificate in m's data dir; a file caught mid-write is
// read at the next scan.
func (l *certLog) scan(m *machine) {
	b, err := os.ReadFile(filepath.Join(m.dataDir, "node.crt"))
	if err != nil {
		return
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return
	}
	s := pki.FormatSerial(c.SerialNumber)
	l.seen[s], l.from[s] = c, m.name
}

func (l *certLog) count() int { return len(l.seen) }

// shortened lists the certificates seen whose life from their time of
// issue (NotBefore plus pki.NodeBackdate) to NotAfter is not ttl, within a
// second.
func (l *certLog) shortened(ttl time.Duration) []string {
	var out []string
	for s, c := range l.seen {
		if life := c.NotAfter.Sub(c.NotBefore.Add(pki.NodeBackdate)); (life - ttl).Abs() > time.Second {
			out = append(out, fmt.Sprintf("%s's certificate %s lives %s from its issue (NotBefore %s, NotAfter %s)",
				l.from[s], s, life, c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339)))
		}
	}
	return out
}

// commandLoad runs exec commands on nodes one after another, round robin,
// through the CLI and the API, each waited for, until stopped.
type commandLoad struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	n      int
	failed []string
}

// startCommandLoad starts the load on d's nodes ids.
func startCommandLoad(d *deployment, ids []string) *commandLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &commandLoad{cancel: cancel, done: make(chan struct{})}
	d.t.Cleanup(func() { l.stop() })
	go func() {
		defer close(l.done)
		for i := 0; ctx.Err() == nil; i++ {
			id := ids[i%len(ids)]
			marker := fmt.Sprintf("load-%d-%s", i, id)
			args := d.viaAPI("--config", d.cfgFile, "commands", "run", "--node", id, "--", "echo", marker)
			// Not the test's context: a command submitted completes, or
			// the test fails, even when stop comes meanwhile.
			runCtx, done := context.WithTimeout(context.Background(), 2*time.Minute)
			cmd := exec.CommandContext(runCtx, d.bc, args...)
			cmd.Env = append(testenv.BaseEnv(), d.env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			done()
			l.mu.Lock()
			l.n++
			if err != nil || !strings.Contains(out.String(), marker) {
				l.failed = append(l.failed, fmt.Sprintf("commands run on %s (%s): %v\n%s", id, marker, err, out.String()))
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// stop ends the load once the command in flight completed, and returns how
// many commands ran and the failures.
func (l *commandLoad) stop() (int, []string) {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, l.failed
}
