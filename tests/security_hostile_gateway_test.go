package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestHostileGatewayFieldsRefused (issue 29, item 6): a real `bcd join` and
// `bcd node` against a hostile gateway, a gRPC server in this test speaking
// the session protocol over mutual TLS 1.3 (sessiontest), which sends
// fields out of range. bcd refuses each with a log line that names the
// field and the bound, ends the session, connects again and stays up (it
// exits 0 on SIGTERM after each case); nothing of the refused messages is
// kept in its data dir (identity.json's known gateways, state.json, the
// command journal) or acted on (the command's program never runs, while a
// well-formed command on the next session does):
//   - a Join answer listing 3,003 gateways: bcd join fails, no identity;
//   - a Welcome listing 3,003 gateways, one with a 4 KiB URL, one with a
//     129-byte session id: no session is established;
//   - a command with a 1 MiB id, a command with an empty id, a cancel
//     with a 1 MiB command id, a Drain preferring 3,003 gateways, a tunnel
//     with an empty id: the session ends.
//
// On the tree at 8bb68ee, before bcd checked these fields, bcd took them:
// no refusal is logged (the first wait fails), the 3,003 URLs land in
// identity.json and the command with the 1 MiB id runs.
func TestHostileGatewayFieldsRefused(t *testing.T) {
	t.Parallel()
	needRoot(t, "bcd in root mode runs commands as the command user")
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: 5 * time.Second})
	tok := p.NewToken(t)
	g.AddToken(tok)
	tokenFile := testenv.WriteFile(t, "join-token", tok)
	m := newMachine(t, "hostile-gw")
	many := make([]string, 3003)
	for i := range many {
		many[i] = fmt.Sprintf("https://hostile-%d.example:8443", i)
	}
	// leaked reports what of the hostile gateway's lists bcd's data dir
	// holds: the files that mention a hostile URL, and the number of
	// known gateways in identity.json.
	leaked := func() (files []string, known int) {
		t.Helper()
		for _, f := range []string{"identity.json", "state.json"} {
			b, err := os.ReadFile(filepath.Join(m.dataDir, f))
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "hostile-") {
				files = append(files, f)
			}
			if f == "identity.json" && len(b) > 0 {
				var id struct {
					KnownGateways []json.RawMessage `json:"known_gateways"`
				}
				if err := json.Unmarshal(b, &id); err != nil {
					t.Fatalf("identity.json: %v", err)
				}
				known = len(id.KnownGateways)
			}
		}
		return files, known
	}

	// A Join answer listing 3,003 gateways: refused, nothing written.
	g.SetJoinGateways(many...)
	code, stdout, stderr := m.join(g.URL, tokenFile)
	if code == 0 || !strings.Contains(stderr, "join gateways lists 3003 gateways, at most 64") {
		t.Errorf("bcd join with a Join answer of 3,003 gateways: exit %d, stderr %q; want a failure naming the bound", code, stderr)
	}
	if m.joined() {
		t.Fatalf("bcd join kept an identity from a Join answer of 3,003 gateways (it printed %.300q)", stdout)
	}
	g.SetJoinGateways(g.URL)
	m.mustJoin(g.URL, tokenFile)

	// Welcomes out of range: no session is established, and bcd tries
	// again (after a backoff of at most 1, 2, 4 s).
	node := m.node()
	for _, c := range []struct {
		name    string
		set     func()
		refusal string
	}{
		{"3,003 gateways", func() { g.SetWelcomeGateways(many...) }, `welcome gateways lists 3003 gateways, at most 64`},
		{"a 4 KiB URL", func() { g.SetWelcomeGateways("https://hostile-long.example/" + strings.Repeat("a", 4096)) },
			`welcome gateways holds a URL of 4125 bytes, at most 2048`},
		{"a 129-byte session id", func() { g.SetWelcomeGateways(g.URL); g.SetWelcomeSessionID(strings.Repeat("s", 129)) },
			`welcome session id of 129 bytes, want 1 to 128`},
	} {
		c.set()
		if _, err := node.Await(`refused its Welcome: field out of range: `+regexp.QuoteMeta(c.refusal), 60*time.Second); err != nil {
			t.Fatalf("a Welcome with %s: no refusal logged: %v\n%s", c.name, err, node.Output())
		}
		if n := countLines(node, sessionEstablished); n != 0 {
			t.Fatalf("a session was established through a Welcome with %s", c.name)
		}
	}
	g.SetWelcomeSessionID("")
	node.WaitLine(sessionEstablished.String(), 60*time.Second)
	if files, known := leaked(); len(files) != 0 || known > 64 {
		t.Errorf("after the refused Welcomes the data dir holds hostile gateways in %v, %d known gateways", files, known)
	}
	stopClean(t, node)

	// Messages out of range inside a session: each ends the session; bcd
	// connects again and runs a well-formed command.
	shared := sharedDir(t)
	hugeID := strings.Repeat("c", 1<<20)
	command := func(id, marker string) *sessionv1.GatewayMessage {
		return &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{
			Id: id, Kind: sessionv1.KindExec,
			Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: []string{"touch", filepath.Join(shared, marker)}}},
		}}}
	}
	for i, c := range []struct {
		name    string
		msg     *sessionv1.GatewayMessage
		marker  string // a file the message's command would make
		refusal string
	}{
		{"a command with a 1 MiB id", command(hugeID, "ran-huge-id"), "ran-huge-id", `command id of 1048576 bytes, want 1 to 128`},
		{"a command with an empty id", command("", "ran-empty-id"), "ran-empty-id", `command id of 0 bytes, want 1 to 128`},
		{"a cancel with a 1 MiB command id", &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Cancel{
			Cancel: &sessionv1.Cancel{CommandId: hugeID, Reason: "hostile"}}}, "", `cancel command id of 1048576 bytes, want 1 to 128`},
		{"a Drain preferring 3,003 gateways", &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Drain{
			Drain: &sessionv1.Drain{Reason: "hostile", PreferGateways: many}}}, "", `drain prefer gateways lists 3003 gateways, at most 64`},
		{"a tunnel with an empty id", &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_TunnelOpen{
			TunnelOpen: &sessionv1.TunnelOpen{Kind: "shell"}}}, "", `tunnel id of 0 bytes, want 1 to 128`},
	} {
		node := m.node()
		s := liveSession(t, g)
		node.WaitLine(sessionEstablished.String(), 30*time.Second)
		if err := s.Send(c.msg); err != nil {
			t.Fatalf("%s: send: %v", c.name, err)
		}
		if _, err := node.Await(`msg="Gateway message refused: ending the session" .*field out of range: `+regexp.QuoteMeta(c.refusal), 30*time.Second); err != nil {
			t.Fatalf("%s: no refusal logged: %v\n%s", c.name, err, node.Output())
		}
		select {
		case <-s.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the session did not end", c.name)
		}
		// bcd connects again and runs a well-formed command; commands run
		// in the order they arrive, so the refused one would have run first.
		s = liveSession(t, g)
		ok := fmt.Sprintf("ok-%d", i)
		if res, _ := execOn(t, s, "cmd_"+ok, false, "touch", filepath.Join(shared, ok)); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
			t.Fatalf("%s: the next well-formed command: %v", c.name, res)
		}
		if c.marker != "" {
			if _, err := os.Stat(filepath.Join(shared, c.marker)); err == nil {
				t.Errorf("%s: its program ran", c.name)
			}
		}
		if b, err := os.ReadFile(filepath.Join(m.dataDir, "commands.journal")); err != nil || strings.Contains(string(b), "ccccccccc") || strings.Contains(string(b), `"id":""`) {
			t.Errorf("%s: the command journal (%d bytes, %v) holds the refused command", c.name, len(b), err)
		}
		if files, known := leaked(); len(files) != 0 || known > 64 {
			t.Errorf("%s: the data dir holds hostile gateways in %v, %d known gateways", c.name, files, known)
		}
		stopClean(t, node)
	}
}

// stopClean stops bcd with SIGTERM and fails t unless it exits 0, as a bcd
// that was not crashed or wedged does.
func stopClean(t *testing.T, p *testenv.Proc) {
	t.Helper()
	select {
	case <-p.Done():
		t.Fatalf("bcd exited before it was stopped:\n%s", p.Output())
	default:
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(60 * time.Second); code != 0 {
		t.Fatalf("bcd exited %d on SIGTERM:\n%s", code, p.Output())
	}
}

// liveSession returns the next session of g whose stream is still open,
// skipping those of refused handshakes and of a bcd stopped before.
func liveSession(t *testing.T, g *sessiontest.Gateway) *sessiontest.Session {
	t.Helper()
	for {
		s := g.NextSession(t, 60*time.Second)
		select {
		case <-s.Done():
		default:
			return s
		}
	}
}
