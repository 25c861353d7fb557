package tests

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

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
