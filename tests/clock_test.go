package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/tests/testenv"
)

// These tests run machines and a control plane whose clocks are wrong
// (issue 36; DESIGN.md, "Identity over time", Clocks). The clocks are
// shifted by test builds: bcd built with the clockshift tag reads its wall
// clock as the system's plus BCD_TEST_CLOCK_OFFSET.

// skewedMachine is a machine whose bcd is the clockshift build with its
// clock off by offset.
type skewedMachine struct {
	*machine
	offset time.Duration
}

// newSkewedMachine makes a machine named name whose clock is off by offset.
func newSkewedMachine(t *testing.T, name string, offset time.Duration) *skewedMachine {
	t.Helper()
	return &skewedMachine{machine: newMachine(t, name), offset: offset}
}

// env is the environment that shifts the clock of m's bcd.
func (m *skewedMachine) env() []string {
	return []string{"BCD_TEST_CLOCK_OFFSET=" + m.offset.String()}
}

// argv returns the program and arguments that run the clockshift bcd with
// args on m.
func (m *skewedMachine) argv(args ...string) (string, []string) {
	tm := m.tm()
	tm.BCD = testenv.BinaryTags(m.t, "bcd", "clockshift")
	return tm.Argv(args...)
}

// mustJoin joins m and returns its node id.
func (m *skewedMachine) mustJoin(gatewayURL, tokenFile string) string {
	m.t.Helper()
	bin, args := m.argv("join", "--gateway", gatewayURL, "--token-file", tokenFile, "--data-dir", m.dataDir)
	code, stdout, stderr := testenv.Run(m.t, m.env(), "", bin, args...)
	if code != 0 {
		m.t.Fatalf("bcd join on %s (clock %v off): exit %d\n%s%s", m.name, m.offset, code, stdout, stderr)
	}
	match := regexp.MustCompile(`Joined as node (\S+) `).FindStringSubmatch(stdout)
	if match == nil {
		m.t.Fatalf("bcd join on %s printed no node id: %q", m.name, stdout)
	}
	return match[1]
}

// node starts bcd node on m.
func (m *skewedMachine) node() *testenv.Proc {
	m.t.Helper()
	bin, args := m.argv("node", "--data-dir", m.dataDir)
	return testenv.Start(m.t, m.env(), bin, args...)
}

// nodeSkew is a node's state and clock skew as `nodes get -o json` shows
// them.
type nodeSkew struct {
	State     string `json:"state"`
	ClockSkew string `json:"clockSkew"` // a JSON duration: "172800.012s"
}

// skew reads node id's state and measured skew through the API.
func (d *deployment) skew(id string) (nodeSkew, time.Duration) {
	d.t.Helper()
	var n nodeSkew
	d.cliJSON(&n, d.viaAPI("nodes", "get", id)...)
	s, _ := time.ParseDuration(n.ClockSkew)
	return n, s
}

// clockSkewTolerated lets nodes up to 1,000 h off take commands: the
// deadline is what TestClockNodeAheadRunsCommands checks.
var clockSkewTolerated = deploymentConfig{gateway: "    clockSkewLimit: 1000h\n"}

// TestClockNodeAheadRunsCommands: a node whose clock is 48 h ahead runs
// commands with the default timeout and with --timeout 24h (bcd judges the
// deadline by the gateway's time, not its own clock), and the control plane
// shows its skew.
func TestClockNodeAheadRunsCommands(t *testing.T) {
	t.Parallel()
	const ahead = 48 * time.Hour
	d := newDeploymentWith(t, backendSQLite, clockSkewTolerated)
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newSkewedMachine(t, "ahead-48h", ahead)
	id := m.mustJoin(d.gatewayURL, tokenFile)
	p := m.node()
	p.WaitLine(sessionEstablished.String(), 60*time.Second)
	eventually(t, 30*time.Second, func() bool {
		_, s := d.skew(id)
		return (s - ahead).Abs() < time.Minute
	}, func() string {
		n, _ := d.skew(id)
		return fmt.Sprintf("nodes get %s: %+v, want a skew of about %v", id, n, ahead)
	})

	for _, extra := range [][]string{nil, {"--timeout", "24h"}} {
		args := append(append([]string{"commands", "run", "--node", id}, extra...), "--", "echo", "on time")
		code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, d.viaAPI(append([]string{"--config", d.cfgFile}, args...)...)...)
		if code != 0 || !strings.Contains(stdout, "on time") {
			t.Fatalf("commands run %v on a node %v ahead: exit %d\n%s%s", extra, ahead, code, stdout, stderr)
		}
	}
	if strings.Contains(p.Output(), "deadline passed") {
		t.Fatalf("bcd reported a passed deadline:\n%s", p.Output())
	}
}

// TestClockNodeSkewedIsHeld: a node 10 min ahead (past the default limit of
// 5 min) becomes clock-skewed: commands naming it are refused saying so,
// better-compute doctor fails naming it, and the event is written.
func TestClockNodeSkewedIsHeld(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newSkewedMachine(t, "ahead-10m", 10*time.Minute)
	id := m.mustJoin(d.gatewayURL, tokenFile)
	m.node().WaitLine(sessionEstablished.String(), 60*time.Second)
	eventually(t, 60*time.Second, func() bool { n, _ := d.skew(id); return n.State == "clock-skewed" },
		func() string { n, _ := d.skew(id); return fmt.Sprintf("nodes get %s: %+v, want clock-skewed", id, n) })

	code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, d.viaAPI("--config", d.cfgFile, "commands", "run", "--node", id, "--", "true")...)
	if code == 0 || !strings.Contains(stdout+stderr, "clock-skewed") {
		t.Fatalf("commands run on a clock-skewed node: exit %d, want a refusal naming clock-skewed\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = testenv.Run(t, d.env, "", d.bc, "--config", d.cfgFile, "doctor")
	if code == 0 || !regexp.MustCompile(`(?s)fleet\.clock-skew.*`+regexp.QuoteMeta(id)).MatchString(stdout+stderr) {
		t.Fatalf("better-compute doctor with a clock-skewed node: exit %d, want a failure of fleet.clock-skew naming %s\n%s%s", code, id, stdout, stderr)
	}
	out := d.cli(d.viaAPI("events", "list", "--type", "node.clock-skewed")...)
	if !strings.Contains(out, id) {
		t.Fatalf("events list --type node.clock-skewed: no event of %s:\n%s", id, out)
	}
}

// run runs the clockshift bcd with args on m and returns its exit code,
// stdout and stderr.
func (m *skewedMachine) run(args ...string) (int, string, string) {
	m.t.Helper()
	bin, argv := m.argv(args...)
	return testenv.Run(m.t, m.env(), "", bin, argv...)
}

// doctorCheck is one check of `bcd doctor -o json`.
type doctorCheck struct {
	ID     string `json:"id"`
	Target string `json:"target"`
	Status string `json:"status"`
	Hint   string `json:"hint"`
	Detail string `json:"detail"`
}

// doctor runs `bcd doctor -o json` on m and returns its checks by id (the
// last of an id wins: one gateway here).
func (m *skewedMachine) doctor() (map[string]doctorCheck, string) {
	m.t.Helper()
	_, stdout, stderr := m.run("doctor", "--data-dir", m.dataDir, "-o", "json")
	var rep struct {
		Checks []doctorCheck `json:"checks"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		m.t.Fatalf("bcd doctor -o json on %s: %v\n%s%s", m.name, err, stdout, stderr)
	}
	out := map[string]doctorCheck{}
	for _, c := range rep.Checks {
		out[c.ID] = c
	}
	return out, stdout + stderr
}

// expiredByOwnClock is bcd's line when it takes its certificate for expired.
var expiredByOwnClock = regexp.MustCompile(`msg="Node certificate expired`)

// TestClockDoctorMeasuresSkew: on a machine 48 h ahead of a real gateway,
// bcd doctor's gateway.clock measures the skew (the gateway's Challenge
// carries its time) and fails naming it; bcd node, restarted, does not
// take its 24 h certificate for expired (no re-attestation), and bcd status
// and bcd doctor judge that certificate by the gateway's time: valid, with
// the skew named.
func TestClockDoctorMeasuresSkew(t *testing.T) {
	t.Parallel()
	const ahead = 48 * time.Hour
	d := newDeploymentWith(t, backendSQLite, clockSkewTolerated)
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newSkewedMachine(t, "doctor-48h", ahead)
	m.mustJoin(d.gatewayURL, tokenFile)

	checks, out := m.doctor()
	clk := checks["gateway.clock"]
	skew := regexp.MustCompile(`skew (\S+) ± (\S+),`).FindStringSubmatch(clk.Detail)
	if clk.Status != "fail" || !strings.Contains(clk.Hint, "48h0m0s ahead of the gateway's") || skew == nil {
		t.Fatalf("bcd doctor on a machine %v ahead: gateway.clock %+v, want a failure naming the measured skew\n%s", ahead, clk, out)
	}
	measured, err := time.ParseDuration(skew[1])
	if err != nil || (measured+ahead).Abs() > time.Minute {
		t.Fatalf("gateway.clock measured a skew of %s (the gateway's clock minus this machine's), want about -%v: %v", skew[1], ahead, err)
	}
	t.Logf("bcd doctor gateway.clock: %s (skew %s ± %s)", clk.Hint, skew[1], skew[2])

	// Twice: the second start is the one that used to re-attest.
	for i := range 2 {
		p := m.node()
		p.WaitLine(sessionEstablished.String(), 60*time.Second)
		if expiredByOwnClock.MatchString(p.Output()) {
			t.Fatalf("bcd node start %d on a machine %v ahead took its certificate for expired:\n%s", i+1, ahead, p.Output())
		}
		if i == 0 {
			p.Stop(syscall.SIGTERM, 30*time.Second)
			continue
		}
		code, stdout, stderr := m.run("status", "--data-dir", m.dataDir)
		if code != 0 || !regexp.MustCompile(`certificate\s+expires \S+ \(\S+ left\)`).MatchString(stdout) ||
			!regexp.MustCompile(`clock\s+17280\d s ahead of the gateway's`).MatchString(stdout) {
			t.Fatalf("bcd status on a machine %v ahead: exit %d, want a certificate with time left and the skew named\n%s%s", ahead, code, stdout, stderr)
		}
		t.Logf("bcd status:\n%s", stdout)
		checks, out := m.doctor()
		if c := checks["node.certificate"]; c.Status != "ok" || !strings.Contains(c.Detail, "the gateway's time") {
			t.Fatalf("bcd doctor node.certificate on a machine %v ahead: %+v, want ok, judged by the gateway's time\n%s", ahead, c, out)
		}
		if c := checks["node.session"]; c.Status != "ok" || !strings.Contains(c.Detail, "ahead of the gateway's") {
			t.Fatalf("bcd doctor node.session on a machine %v ahead: %+v, want ok naming the skew\n%s", ahead, c, out)
		}
	}
}

// TestClockDeadRTCReattests: a machine whose certificate expired while it
// was off boots with its clock 30 days behind (a dead RTC, no NTP). By its
// own clock the certificate is valid, so it presents it; the gateway
// refuses it in the handshake; bcd asks the gateway's time without a
// certificate (the Challenge's server_time), finds the certificate expired
// by it, re-attests by itself and holds a session.
func TestClockDeadRTCReattests(t *testing.T) {
	t.Parallel()
	const behind = -30 * 24 * time.Hour
	cfg := shortCerts
	cfg.gateway += clockSkewTolerated.gateway
	d := newDeploymentWith(t, backendSQLite, cfg)
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newSkewedMachine(t, "dead-rtc", 0)
	id := m.mustJoin(d.gatewayURL, tokenFile)
	// Off until the certificate has expired.
	notAfter := nodeCertNotAfter(t, m.machine)
	time.Sleep(time.Until(notAfter.Add(2 * time.Second)))

	m.offset = behind
	p := m.node()
	p.WaitLine(`msg="Node certificate re-attested"`, 90*time.Second)
	p.WaitLine(sessionEstablished.String(), 60*time.Second)
	// The certificate is valid by the machine's clock: it was presented,
	// refused, and judged by the gateway's time.
	if !strings.Contains(p.Output(), `msg="Gateway refused the node certificate in the TLS handshake`) {
		t.Fatalf("bcd node re-attested without its certificate refused first:\n%s", p.Output())
	}
	wantAudit(t, d, admission.ActionReattest, id, admission.OutcomeSuccess)
	if na := nodeCertNotAfter(t, m.machine); !na.After(time.Now()) {
		t.Fatalf("node.crt after the re-attestation expires at %v, in the past", na)
	}
	eventually(t, 30*time.Second, func() bool {
		_, s := d.skew(id)
		return (s - behind).Abs() < time.Minute
	}, func() string {
		n, _ := d.skew(id)
		return fmt.Sprintf("nodes get %s: %+v, want a skew of about %v", id, n, behind)
	})
	t.Logf("a node %v behind, certificate expired at %s, re-attested; the gateway measures its skew", behind, notAfter.UTC().Format(time.RFC3339))
}

// TestClockControlPlaneBehindNotReady: a control plane whose clock is set
// back 48 h (a restored VM, an RTC after a power loss) does not become
// ready and says why, naming the clock (its log, /readyz, better-compute
// doctor): its gateway does not listen, so no node's valid certificate is
// refused and no join spends a token's use. Once its clock is right every
// node reconnects as itself, without a re-join, and the token that a join
// tried during the wrong clock still admits its one join.
func TestClockControlPlaneBehindNotReady(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		const behind = -48 * time.Hour
		d := newDeployment(t, backend)
		tokenFile, _ := d.joinToken(2, time.Hour)
		var ids []string
		var procs []*testenv.Proc
		for _, name := range []string{"fleet-01", "fleet-02"} {
			m := newMachine(t, name)
			ids = append(ids, m.mustJoin(d.gatewayURL, tokenFile))
			p := m.node()
			p.WaitLine(sessionEstablished.String(), 60*time.Second)
			procs = append(procs, p)
		}
		lateToken, _ := d.joinToken(1, time.Hour)

		d.serve.Stop(syscall.SIGTERM, 30*time.Second)
		shifted := testenv.Start(t, append(slices.Clone(d.env), "BETTER_COMPUTE_TEST_CLOCK_OFFSET="+behind.String()),
			testenv.BinaryTags(t, "better-compute", "clockshift"), "serve", "--config", d.cfgFile)
		line := shifted.WaitLine(`msg="Not ready: this process's clock is wrong.*`, 60*time.Second)[0]
		shifted.WaitLine(`msg="API listening"`, 60*time.Second)
		t.Logf("%s: serve set back %v logs: %s", backend, -behind, line)

		code, body := httpGet(t, d.api+"/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "clock is wrong") {
			t.Fatalf("/readyz of a control plane %v behind: %d %q, want 503 naming the clock", -behind, code, body)
		}
		t.Logf("%s: /readyz: %d %s", backend, code, strings.TrimSpace(body))
		code, stdout, stderr := testenv.Run(t, append(slices.Clone(d.env), "BETTER_COMPUTE_TEST_CLOCK_OFFSET="+behind.String()), "",
			testenv.BinaryTags(t, "better-compute", "clockshift"), "--config", d.cfgFile, "doctor")
		if code == 0 || !regexp.MustCompile(`(?m)^clock\s+fail\s`).MatchString(stdout) {
			t.Fatalf("better-compute doctor on a control plane %v behind: exit %d, want the clock check failed\n%s%s", -behind, code, stdout, stderr)
		}

		// A join tried now reaches no gateway and spends nothing.
		late := newMachine(t, "late-01")
		if code, stdout, stderr := late.join(d.gatewayURL, lateToken); code == 0 {
			t.Fatalf("bcd join while the control plane's clock is wrong succeeded:\n%s%s", stdout, stderr)
		}
		if strings.Contains(shifted.Output(), `msg="Gateway listening"`) {
			t.Fatalf("the gateway of a control plane %v behind listened:\n%s", -behind, shifted.Output())
		}

		// The clock is right again.
		shifted.Stop(syscall.SIGTERM, 30*time.Second)
		before := make([]int, len(procs))
		for i, p := range procs {
			before[i] = countLines(p, sessionEstablished)
		}
		d.start()
		for i, p := range procs {
			eventually(t, 90*time.Second, func() bool { return countLines(p, sessionEstablished) > before[i] },
				func() string { return fmt.Sprintf("node %s did not reconnect:\n%s", ids[i], p.Output()) })
			if countLines(p, regexp.MustCompile(`re-attest|Joined as node`)) > 0 {
				t.Fatalf("node %s re-attested or re-joined after the control plane's clock was fixed:\n%s", ids[i], p.Output())
			}
		}
		nodes := d.nodes()
		for _, id := range ids {
			eventually(t, 30*time.Second, func() bool { nodes = d.nodes(); return nodes[id].State == "ready" },
				func() string { return fmt.Sprintf("node %s after the clock was fixed: %+v, want ready", id, nodes[id]) })
		}
		// The token's one use is still there.
		late.mustJoin(d.gatewayURL, lateToken)
	})
}

// httpGet returns the status and body of a GET of url.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}
