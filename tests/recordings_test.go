package tests

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// recordingTarget starts the embedded default with extra configuration
// and a real bcd joined to it, for shells to record.
func recordingTarget(t *testing.T, name string, extra deploymentConfig) (*deployment, *tunnelTarget) {
	t.Helper()
	d := newDeploymentWith(t, backendSQLite, extra)
	file, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, name)
	nodeID := m.mustJoin(d.gatewayURL, file)
	bcd := m.node()
	bcd.WaitLine(sessionEstablished.String(), 30*time.Second)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve's output:\n%s\nbcd's output:\n%s", d.serve.Output(), bcd.Output())
		}
	})
	return d, &tunnelTarget{bc: d.bc, env: []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + d.adminToken},
		admin: &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}, st: d.st, nodeID: nodeID, bcd: bcd}
}

// tunnelAudit returns the details of the newest audit row of action
// (tunnels.open or tunnels.close) for tunnel id, nil when there is none.
func tunnelAudit(t *testing.T, st store.Store, action, tunnelID string) map[string]any {
	t.Helper()
	entries, err := st.AuditQuery(context.Background(), &store.AuditQueryParams{ActionPrefix: action, Resource: tunnelID, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Action == action && e.Outcome == "ok" {
			var d map[string]any
			if err := json.Unmarshal(e.Details, &d); err != nil {
				t.Fatalf("%s audit details %s: %v", action, e.Details, err)
			}
			return d
		}
	}
	return nil
}

// onlyRecording waits until the node has exactly one recording in a
// state other than recording (the shell ended) and returns it.
func onlyRecording(t *testing.T, st store.Store, nodeID string) *store.Recording {
	t.Helper()
	var rec *store.Recording
	testenv.Eventually(t, 20*time.Second, func() bool {
		recs, err := st.RecordingList(context.Background(), &store.RecordingListParams{NodeID: nodeID})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 || recs[0].State == store.RecordingRecording {
			return false
		}
		rec = recs[0]
		return true
	}, func() string { return "no single ended recording of node " + nodeID })
	return rec
}

// castEvent is a line of recordings play --events.
type castEvent struct {
	at   float64
	code string
	data string
}

func parseCast(t *testing.T, out string) []castEvent {
	t.Helper()
	var evs []castEvent
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var raw []any
		if err := json.Unmarshal([]byte(line), &raw); err != nil || len(raw) != 3 {
			t.Fatalf("recordings play --events line %q: %v", line, err)
		}
		at, _ := raw[0].(float64)
		code, _ := raw[1].(string)
		data, _ := raw[2].(string)
		evs = append(evs, castEvent{at, code, data})
	}
	return evs
}

// TestRecordingShell: a shell on a real bcd through nodes shell is
// recorded at the API process: recordings list shows it (to a viewer too),
// recordings play prints what was typed and printed in order, --events
// shows the keys typed before the output they caused and the window sizes,
// playback at real speed keeps the recorded pause, and both audit rows of
// the shell name the recording. A viewer of another tenant can neither
// list nor play it (a recording is the tenant's of the token that opened
// the shell: here the root's). The chunks in the database are sealed: the
// typed text is not in them.
func TestRecordingShell(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, tt := recordingTarget(t, "rec-shell", deploymentConfig{})

	sh := startShell(t, tt, 30, 100)
	sh.send(t, "echo rec-$((6*7))\r")
	sh.expect(t, regexp.MustCompile(`rec-42\r`))
	sh.send(t, "sleep 2; echo late-$((1+1))\r")
	sh.expect(t, regexp.MustCompile(`late-2\r`))
	sh.send(t, "exit 5\r")
	if code := sh.exit(t, 15*time.Second); code != 5 {
		t.Fatalf("nodes shell exited %d, want 5\n%s", code, sh.output())
	}
	rec := onlyRecording(t, d.st, tt.nodeID)
	if rec.State != store.RecordingComplete || rec.Bytes <= 0 || rec.Chunks < 1 || rec.CreatedBy == "" {
		t.Fatalf("recording = %+v, want complete with bytes", rec)
	}

	// Both audit rows of the shell name the recording.
	for _, action := range []string{"tunnels.open", "tunnels.close"} {
		var details map[string]any
		testenv.Eventually(t, 10*time.Second, func() bool {
			details = tunnelAudit(t, d.st, action, rec.TunnelID)
			return details != nil
		}, func() string { return "no " + action + " audit row for " + rec.TunnelID })
		if details["recordingId"] != rec.ID {
			t.Fatalf("%s audit details = %v, want recordingId %s", action, details, rec.ID)
		}
	}

	// A viewer lists it, by node and in all.
	viewer, _, err := iam.Create(ctx, d.st, iam.CreateParams{Role: store.RoleViewer, Description: "recording viewer"})
	if err != nil {
		t.Fatal(err)
	}
	asViewer := []string{"--server", d.api, "--token", viewer}
	for _, args := range [][]string{{"recordings", "list"}, {"recordings", "list", "--node", tt.nodeID}} {
		out := d.cli(append(args, asViewer...)...)
		if !strings.Contains(out, rec.ID) || !strings.Contains(out, "complete") {
			t.Fatalf("better-compute %s:\n%s\nwant %s, complete", strings.Join(args, " "), out, rec.ID)
		}
	}
	if out := d.cli(append([]string{"recordings", "list", "--node", "node_other"}, asViewer...)...); strings.Contains(out, rec.ID) {
		t.Fatalf("recordings list --node node_other lists %s:\n%s", rec.ID, out)
	}

	// A viewer of another tenant sees none of it: the recording is the
	// root's (its shell's token's), so list shows nothing of it and play
	// is NOT_FOUND, as for a recording that does not exist.
	other, err := tt.admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: "other-team"})
	if err != nil {
		t.Fatal(err)
	}
	otherViewer, err := tt.admin.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: store.RoleViewer, Tenant: other.Id, Description: "other tenant's viewer"})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"recordings", "list"}, {"recordings", "list", "--node", tt.nodeID},
		{"recordings", "play", rec.ID, "--speed", "0"}} {
		code, stdout, stderr := testenv.Run(t, nil, "", d.bc, append(args, "--server", d.api, "--token", otherViewer.Token)...)
		play := args[1] == "play"
		if play != (code != 0) || strings.Contains(stdout, rec.ID) || strings.Contains(stdout, "rec-42") ||
			play && !strings.Contains(stderr, "NOT_FOUND") {
			t.Fatalf("better-compute %s as another tenant's viewer: exit %d\n%s%s\nwant nothing of %s (play: NOT_FOUND)",
				strings.Join(args, " "), code, stdout, stderr, rec.ID)
		}
	}

	// Played at once: what was typed (as the terminal echoed it) and
	// printed, in order.
	played := d.cli(append([]string{"recordings", "play", rec.ID, "--speed", "0"}, asViewer...)...)
	order := []string{"echo rec-$((6*7))", "rec-42\r\n", "sleep 2; echo late-$((1+1))", "late-2\r\n", "exit 5"}
	at := 0
	for _, want := range order {
		i := strings.Index(played[at:], want)
		if i < 0 {
			t.Fatalf("recordings play --speed 0 lacks %q after byte %d (in order %q):\n%q", want, at, order, played)
		}
		at += i + len(want)
	}

	// Every event: the keys typed come before the output they caused; the
	// window size is there.
	evs := parseCast(t, d.cli(append([]string{"recordings", "play", rec.ID, "--events"}, asViewer...)...))
	if evs[0].code != "r" || evs[0].data != "100x30" {
		t.Fatalf("first event %+v, want the window 100x30", evs[0])
	}
	typedCommand := regexp.MustCompile(`echo rec-\$\(\(6\*7\)\)[\r\n]`)
	var typed, printed strings.Builder
	typedAt, printedAt := -1, -1
	last := 0.0
	for i, ev := range evs {
		if ev.at < last {
			t.Fatalf("event %d at %v s is before the one before it (%v s)", i, ev.at, last)
		}
		last = ev.at
		switch ev.code {
		case "i":
			typed.WriteString(ev.data)
			// The enter key is \r, or \n when typed before the CLI made
			// its terminal raw.
			if typedAt < 0 && typedCommand.MatchString(typed.String()) {
				typedAt = i
			}
		case "o":
			printed.WriteString(ev.data)
			if printedAt < 0 && strings.Contains(printed.String(), "rec-42\r\n") {
				printedAt = i
			}
		}
	}
	if typedAt < 0 || printedAt < 0 || typedAt > printedAt {
		t.Fatalf("typed the command at event %d, printed rec-42 at event %d; want both, typed first:\n%+v", typedAt, printedAt, evs)
	}
	if !regexp.MustCompile(`exit 5[\r\n]`).MatchString(typed.String()) {
		t.Fatalf("the typed input %q lacks exit 5", typed.String())
	}

	// At real speed the recorded pause of sleep 2 is kept (a lower bound
	// only: a loaded machine may be slower, never faster).
	start := time.Now()
	d.cli(append([]string{"recordings", "play", rec.ID}, asViewer...)...)
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("recordings play at real speed took %v, want at least the recorded 2 s pause (less a margin)", took)
	}
	t.Logf("recordings play at real speed took %v", time.Since(start).Round(time.Millisecond))

	// The chunks are sealed: the typed text is nowhere in them.
	chunks, err := d.st.RecordingChunks(ctx, &store.RecordingChunksParams{RecordingID: rec.ID, After: -1, Limit: 1000})
	if err != nil || len(chunks) == 0 {
		t.Fatalf("chunks: %d, %v", len(chunks), err)
	}
	for _, c := range chunks {
		if strings.Contains(string(c.Sealed), "rec-") {
			t.Fatalf("chunk %d holds the shell's text in the clear", c.Seq)
		}
	}
}

// TestRecordingFailureClosesShell: a shell whose recording fails is
// closed with its reason (onFailure close, the default): first when the
// database refuses the recording's chunks (a trigger that fails every
// insert into recording_chunks), then when a recording passes
// host.gateway.tunnels.recording.maxBytes. The recordings end failed,
// with their reasons, and the tunnels.close rows say why.
func TestRecordingFailureClosesShell(t *testing.T) {
	t.Parallel()
	d, tt := recordingTarget(t, "rec-fail", deploymentConfig{gateway: "    tunnels:\n      recording:\n        maxBytes: 65536\n"})
	exec := sqlitetest.Exec(filepath.Join(d.dataDir, backend.EmbeddedFile))
	ctx := context.Background()

	// The database refuses every chunk from now on.
	sh := startShell(t, tt, 24, 80)
	sh.send(t, "echo ready-$((6*7))\r")
	sh.expect(t, regexp.MustCompile(`ready-42\r`))
	if err := exec(ctx, `CREATE TRIGGER refuse_chunks BEFORE INSERT ON recording_chunks BEGIN SELECT RAISE(ABORT, 'chunk refused by test'); END`); err != nil {
		t.Fatal(err)
	}
	sh.send(t, "echo more-$((6*7))\r")
	code := sh.exit(t, 30*time.Second)
	if code == 0 || !sh.wait(regexp.MustCompile("its recording failed"), 10*time.Second) {
		t.Fatalf("nodes shell exited %d when its recording failed, want a failure naming the recording:\n%s", code, sh.output())
	}
	rec := onlyRecording(t, d.st, tt.nodeID)
	if rec.State != store.RecordingFailed || !strings.Contains(rec.Reason, "chunk refused by test") {
		t.Fatalf("recording = %+v, want failed with the database's refusal", rec)
	}
	var closed map[string]any
	testenv.Eventually(t, 10*time.Second, func() bool {
		closed = tunnelAudit(t, d.st, "tunnels.close", rec.TunnelID)
		return closed != nil
	}, func() string { return "no tunnels.close row" })
	if reason, _ := closed["reason"].(string); !strings.HasPrefix(reason, "recording failed") || closed["recordingId"] != rec.ID {
		t.Fatalf("tunnels.close details = %v, want reason recording failed and the recording id", closed)
	}
	if err := exec(ctx, `DROP TRIGGER refuse_chunks`); err != nil {
		t.Fatal(err)
	}

	// Past maxBytes (64 KiB): 100,000 bytes of output.
	sh = startShell(t, tt, 24, 80)
	sh.send(t, "echo ready-$((6*7))\r")
	sh.expect(t, regexp.MustCompile(`ready-42\r`))
	sh.send(t, "head -c 100000 /dev/zero | tr '\\0' x; echo; sleep 30\r")
	code = sh.exit(t, 30*time.Second)
	// The terminal's last bytes may still be on their way from the pty.
	if code == 0 || !sh.wait(regexp.MustCompile("size limit"), 10*time.Second) {
		t.Fatalf("nodes shell exited %d past the recording's size limit, want a failure naming the limit:\n%s", code, sh.output()[max(0, len(sh.output())-2000):])
	}
	var failed *store.Recording
	testenv.Eventually(t, 20*time.Second, func() bool {
		recs, err := d.st.RecordingList(ctx, &store.RecordingListParams{NodeID: tt.nodeID})
		if err != nil {
			t.Fatal(err)
		}
		failed = recs[0]
		return len(recs) == 2 && failed.State == store.RecordingFailed
	}, func() string { return "the second recording never ended failed" })
	if !strings.Contains(failed.Reason, "size limit") || failed.Bytes > 65536 {
		t.Fatalf("recording = %+v, want failed at its size limit with at most 65536 bytes", failed)
	}
}

// TestRecordingFailureContinue: with onFailure continue, a shell whose
// recording passes maxBytes goes on (unrecorded), and its recording ends
// failed.
func TestRecordingFailureContinue(t *testing.T) {
	t.Parallel()
	d, tt := recordingTarget(t, "rec-cont", deploymentConfig{gateway: "    tunnels:\n      recording:\n        onFailure: continue\n        maxBytes: 65536\n"})
	sh := startShell(t, tt, 24, 80)
	sh.send(t, "head -c 100000 /dev/zero | tr '\\0' x; echo; echo after-$((6*7))\r")
	sh.expect(t, regexp.MustCompile(`after-42\r`))
	sh.send(t, "echo still-$((6*7))\r")
	sh.expect(t, regexp.MustCompile(`still-42\r`))
	sh.send(t, "exit\r")
	if code := sh.exit(t, 15*time.Second); code != 0 {
		t.Fatalf("nodes shell exited %d, want 0 (the shell goes on past its recording's failure)", code)
	}
	rec := onlyRecording(t, d.st, tt.nodeID)
	if rec.State != store.RecordingFailed || !strings.Contains(rec.Reason, "size limit") {
		t.Fatalf("recording = %+v, want failed at its size limit", rec)
	}
}
