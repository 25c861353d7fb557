package tests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// internalRotationView is `pki rotate internal-ca ARGS -o json`: the
// counts are processes with the internal control API.
type internalRotationView struct {
	Rotation struct {
		ID          string   `json:"id"`
		CA          string   `json:"ca"`
		Phase       string   `json:"phase"`
		NewCAID     string   `json:"newCaId"`
		Live        int      `json:"liveNodes"`
		Trusting    int      `json:"ackedNodes"`
		NotTrusting []string `json:"missingNodeIds"`
		OffNewCA    int      `json:"nodesOffNewCa"`
		Waiting     string   `json:"waiting"`
	} `json:"rotation"`
}

func (d *splitDeployment) internalRotation(t *testing.T, args ...string) internalRotationView {
	t.Helper()
	var v internalRotationView
	out := d.cli(t, append(append([]string{"pki", "rotate", "internal-ca"}, args...), "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("pki rotate internal-ca %v -o json: %v\n%s", args, err, out)
	}
	return v
}

// internalFailure matches what the api logs when an internal control API
// call fails and it falls back (a wake-up to the bus, a revocation to the
// gateways' poll). A relayed tunnel that cannot open fails the CLI that
// opens it.
var internalFailure = regexp.MustCompile(`Internal wake-up failed|Internal revocation push failed`)

// TestInternalCARotationSplitRoles rotates the internal CA of the
// production shape on PostgreSQL (issue 35's "Done when"): an api, a
// worker (with the rotation reconciler) and two gateways as separate
// processes, all with the internal control API and one pair of internal
// certificate files from `pki issue-internal`; a real bcd on the second
// gateway and 40 FakeDaemons; commands created through the api throughout
// (each wakes its node's gateway over the internal control API), and a
// `nodes port-forward` tunnel the api relays over it, open on one TCP
// connection from before start to the end. An operator runs `start`, and
// nothing else:
//
//   - status counts the three processes with the internal control API (the
//     worker has none), and the reconciler activates once all three trust
//     the new CA and retires once all three present a certificate from it
//     (re-issued in memory for the files' key: the files are not touched);
//   - each gateway's internal listener then serves a certificate from the
//     new CA;
//   - a gateway restarted after retirement, whose files still hold the old
//     CA's certificate, re-issues it from the new CA at start, and the api
//     reaches it: a new tunnel to the node opens through it;
//   - no internal call failed (the api logged no fallback), every command
//     succeeded and the tunnel carried bytes in every phase.
func TestInternalCARotationSplitRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	internal := internalAPIConfig(t)
	d := newSplitDeploymentWith(t, 2, 1, func(env []string) string {
		// Heartbeats every second: the processes' rows, the rotation's
		// proof, follow the bundle within a second or two.
		return internal(env) + "  processes:\n    heartbeatInterval: 1s\n    pruneAfter: 10s\n"
	})
	fleet := d.joinFleet(ctx, 20)
	m, real := d.joinMachine("inca-01", d.gateways[1])
	m.node()
	d.waitSession(real, d.gateways[1])
	all := []string{real}
	for _, dm := range fleet.daemons {
		all = append(all, dm.NodeID())
	}
	toAll := startCommands(d.admin, all, 50*time.Millisecond)
	var marks []string
	mark := func(phase string) { marks = append(marks, fmt.Sprintf("%s:%d", phase, toAll.created())) }
	cliEnv := []string{"BETTER_COMPUTE_URL=" + strings.TrimSuffix(d.api, "/api"), "BETTER_COMPUTE_TOKEN=" + d.admin.Token}
	through := echoTunnel(t, cliEnv, d.bin, real)
	through("before start")
	internalAddr := func(g *splitProc) string {
		return g.p.WaitLine(`msg="Internal control API listening" addr=(\S+)`, 30*time.Second)[1]
	}
	b, err := bootstrap.LoadBundle(ctx, d.st, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	oldCA := b.InternalCA.Cert
	for _, g := range d.gateways {
		if chain := internalChain(t, internalAddr(g)); chain[0].CheckSignatureFrom(oldCA) != nil {
			t.Fatalf("%s's internal listener serves a certificate the internal CA did not issue", g.name)
		}
	}
	t.Logf("deployment up, 1 bcd and %d FakeDaemons with sessions, tunnel open, %v since start", len(fleet.daemons), time.Since(began).Round(time.Millisecond))

	v := d.internalRotation(t, "start", "--reason", "e2e split roles")
	if v.Rotation.Phase != "propagating" || v.Rotation.CA != "internal" {
		t.Fatalf("start: %+v", v.Rotation)
	}
	startedAt := time.Now()
	mark("started")
	through("after start")

	// The reconciler moves it on, once on proof that every process trusts
	// the new CA, once on proof that each presents a certificate from it.
	var seen []string
	eventually(t, 2*time.Minute, func() bool {
		v = d.internalRotation(t, "status")
		if len(seen) == 0 || seen[len(seen)-1] != v.Rotation.Phase {
			seen = append(seen, v.Rotation.Phase)
			through("while " + v.Rotation.Phase)
			mark(v.Rotation.Phase)
		}
		return v.Rotation.Phase == "retired"
	}, func() string { return fmt.Sprintf("the internal-CA rotation never retired: %+v", v.Rotation) })
	t.Logf("phases seen %v; retired by the reconciler %v after start", seen, time.Since(startedAt).Round(time.Millisecond))
	if v.Rotation.Live != 3 || v.Rotation.Trusting != 3 || v.Rotation.OffNewCA != 0 {
		t.Fatalf("retired: %+v; want 3 processes (api and two gateways), all trusting and presenting the new CA", v.Rotation)
	}
	for _, phase := range []string{store.RotationActivated, store.RotationRetired} {
		d.workers[0].p.WaitLine(`msg="Internal CA rotation advanced by the reconciler".*phase=`+phase, 10*time.Second)
	}
	if b, err = bootstrap.LoadBundle(ctx, d.st, testSecret); err != nil {
		t.Fatal(err)
	}
	newCA := b.InternalCA.Cert
	if pki.NodeCAID(newCA) != v.Rotation.NewCAID || newCA.Equal(oldCA) || len(b.InternalCARoots()) != 1 {
		t.Fatalf("the retired bundle's internal CA is %s with %d roots, want %s alone", pki.NodeCAID(newCA), len(b.InternalCARoots()), v.Rotation.NewCAID)
	}
	for _, g := range d.gateways {
		chain := internalChain(t, internalAddr(g))
		if chain[0].CheckSignatureFrom(newCA) != nil {
			t.Fatalf("%s's internal listener serves a certificate from %s after retirement, want the new CA", g.name, chain[0].Issuer)
		}
	}
	through("after retirement")
	mark("retired")

	// A gateway restarted now still has the old CA's certificate in its
	// files: it re-issues it at start, and the api reaches it.
	g := d.gateways[1]
	g.p.Stop(syscall.SIGTERM, 15*time.Second)
	g.p = d.start(g.name, "gateway")
	g.p.WaitLine(`msg="Internal certificate re-issued from the internal CA in force"`, 60*time.Second)
	if chain := internalChain(t, internalAddr(g)); chain[0].CheckSignatureFrom(newCA) != nil {
		t.Fatalf("the restarted %s serves a certificate from %s, want the new CA", g.name, chain[0].Issuer)
	}
	eventually(t, 90*time.Second, func() bool {
		s, err := d.st.SessionGet(ctx, real)
		return err == nil && s.GatewayID != "" && slices.ContainsFunc(d.gateways, func(g *splitProc) bool { return g.id == s.GatewayID })
	}, func() string { return "the real node never came back after its gateway restarted" })
	again := echoTunnel(t, cliEnv, d.bin, real)
	again("through a new tunnel after the restart")
	mark("restarted")

	n := toAll.created()
	eventually(t, 30*time.Second, func() bool { return toAll.created() >= n+10 },
		func() string { return "no commands after the restart" })
	ids, errs := toAll.stopAndList()
	if len(errs) > 0 {
		t.Errorf("%d commands.create calls failed, the first: %v", len(errs), errs[0])
	}
	d.checkCommandsSucceeded(ids, marks)
	if lines := internalFailure.FindAllString(d.apiProc.Output(), -1); len(lines) > 0 {
		t.Errorf("the api logged %d failed internal calls (%q …)", len(lines), lines[0])
	}
	t.Logf("TestInternalCARotationSplitRoles done in %v", time.Since(began).Round(time.Millisecond))
}

// internalChain returns the certificates the internal control API at addr
// presents (read during the handshake; this client offers none, so the
// server refuses it afterwards).
func internalChain(t *testing.T, addr string) []*x509.Certificate {
	t.Helper()
	var chain []*x509.Certificate
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{"h2"},
		VerifyConnection: func(cs tls.ConnectionState) error { chain = cs.PeerCertificates; return nil }})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	_ = tc.Handshake() // the server asks for a client certificate; none is sent
	if len(chain) == 0 {
		t.Fatalf("the internal control API at %s presented no certificate", addr)
	}
	return chain
}
