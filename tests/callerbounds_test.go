package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestHostileNodeOutputBounded (issue 28): a node sends 1 GiB of output,
// 64 KiB at a time, for a command of the default 1 MiB limit, then its
// result, then more output. On PostgreSQL against a real serve: the
// command keeps exactly 1 MiB and is marked truncated, nothing sent after
// the result is kept, the tables that hold output grow by at most the
// limit plus 10 %, and reading the command back (the CLI follows the
// output's pages) grows the control plane's RSS by less than 64 MiB.
func TestHostileNodeOutputBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeployment(t, backendPostgres)
	tokenFile, _ := d.joinToken(1, time.Hour)
	fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "hostile-output-01", Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fd.Join(ctx, d.gatewayURL, strings.TrimSpace(readFile(t, tokenFile))); err != nil {
		t.Fatal(err)
	}
	simCtx, stopSim := context.WithCancel(ctx)
	simDone := make(chan error, 1)
	go func() { simDone <- fd.Run(simCtx) }()
	t.Cleanup(func() { stopSim(); <-simDone })
	eventually(t, 30*time.Second, func() bool { return d.nodes()[fd.NodeID()].State == "ready" },
		func() string { return fmt.Sprintf("node %s is %+v, want ready", fd.NodeID(), d.nodes()[fd.NodeID()]) })

	// The node takes the command and never answers it on its own: the
	// test speaks for it.
	fd.Hang()
	cmd := d.runNoWait(fd.NodeID(), nil, "cat", "/dev/urandom")
	eventually(t, 30*time.Second, func() bool { return d.command(cmd).State == "dispatched" },
		func() string { return fmt.Sprintf("command %s: %+v, want dispatched", cmd, d.command(cmd)) })

	db, err := pgx.Connect(ctx, d.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	// sizes is each table's size with its TOAST and indexes, and the
	// database's.
	sizes := func() (map[string]int64, int64) {
		t.Helper()
		rows, err := db.Query(ctx, `SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND n.nspname = current_schema()`)
		if err != nil {
			t.Fatal(err)
		}
		tables := map[string]int64{}
		for rows.Next() {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			tables[name] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		var database int64
		if err := db.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&database); err != nil {
			t.Fatal(err)
		}
		return tables, database
	}
	tablesBefore, dbBefore := sizes()

	// 1 GiB of random (incompressible) output in 64 KiB chunks.
	const chunk, total = 64 << 10, 1 << 30
	block := make([]byte, 1<<20)
	if _, err := rand.Read(block); err != nil {
		t.Fatal(err)
	}
	send := func(u *sessionv1.CommandUpdate) {
		t.Helper()
		u.CommandId = cmd
		if err := fd.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_CommandUpdate{CommandUpdate: u}}); err != nil {
			t.Fatalf("send update %d: %v", u.UpdateSeq, err)
		}
	}
	output := func(seq uint64) {
		off := (seq * chunk) % uint64(len(block))
		send(&sessionv1.CommandUpdate{UpdateSeq: seq, Update: &sessionv1.CommandUpdate_Output{Output: &sessionv1.OutputChunk{
			Stream: sessionv1.OutputStream_OUTPUT_STREAM_STDOUT, Data: block[off : off+chunk]}}})
	}
	rssIdle := rssBytes(t, d.serve.Pid())
	start := time.Now()
	seq := uint64(0)
	for range total / chunk {
		seq++
		output(seq)
	}
	sent := time.Since(start)
	// The result, then 16 MiB more: the gateway writes a session's updates
	// in order, so once the result is in, so is everything before it.
	seq++
	send(&sessionv1.CommandUpdate{UpdateSeq: seq, Update: &sessionv1.CommandUpdate_Result{Result: &sessionv1.CommandResult{
		State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}}})
	for range (16 << 20) / chunk {
		seq++
		output(seq)
	}
	// A last result (ignored: the first wins) marks the late output as
	// handled once the node's next update is.
	seq++
	send(&sessionv1.CommandUpdate{UpdateSeq: seq, Update: &sessionv1.CommandUpdate_Result{Result: &sessionv1.CommandResult{
		State: sessionv1.CommandState_COMMAND_STATE_FAILED}}})
	eventually(t, 60*time.Second, func() bool { return d.command(cmd).State == "succeeded" },
		func() string { return fmt.Sprintf("command %s: %+v, want succeeded", cmd, d.command(cmd)) })

	var stored, outputBytes int64
	var truncated bool
	eventually(t, 30*time.Second, func() bool {
		err := db.QueryRow(ctx, `SELECT coalesce((SELECT sum(length(data)) FROM command_output WHERE command_id = $1), 0),
			output_bytes, output_truncated FROM commands WHERE id = $1`, cmd).Scan(&stored, &outputBytes, &truncated)
		return err == nil && stored == sessionv1.DefaultOutputLimitBytes
	}, func() string {
		return fmt.Sprintf("stored %d bytes of output, want %d", stored, sessionv1.DefaultOutputLimitBytes)
	})
	if outputBytes != sessionv1.DefaultOutputLimitBytes || !truncated {
		t.Fatalf("command %s: output_bytes %d truncated %v, want %d true", cmd, outputBytes, truncated, sessionv1.DefaultOutputLimitBytes)
	}
	tablesAfter, dbAfter := sizes()
	var grew []string
	for name, n := range tablesAfter {
		if d := n - tablesBefore[name]; d != 0 {
			grew = append(grew, fmt.Sprintf("%s %+d", name, d))
		}
	}
	slices.Sort(grew)
	grown, bound := tablesAfter["command_output"]-tablesBefore["command_output"], int64(sessionv1.DefaultOutputLimitBytes)*11/10
	t.Logf("sent %d MiB in %s (%.0f MiB/s); kept %d bytes; command_output grew %d bytes (bound %d), the database %d bytes; tables grown (bytes): %s",
		total>>20, sent.Round(time.Millisecond), float64(total>>20)/sent.Seconds(), stored, grown, bound, dbAfter-dbBefore, strings.Join(grew, ", "))
	if grown > bound {
		t.Fatalf("command_output grew %d bytes for a 1 MiB limit, more than %d", grown, bound)
	}

	// Reading it back: the CLI follows the pages; sample the control
	// plane's RSS while it does.
	rssBefore := rssBytes(t, d.serve.Pid())
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := rssBytes(t, d.serve.Pid()); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	var got commandView
	d.cliJSON(&got, d.viaAPI("commands", "get", cmd)...)
	close(stop)
	<-sampled
	growth := peak.Load() - rssBefore
	t.Logf("control plane RSS %d MiB before the 1 GiB, %d MiB after; reading the output: peak %d MiB (growth %d KiB)",
		rssIdle>>20, rssBefore>>20, peak.Load()>>20, growth>>10)
	if growth >= 64<<20 {
		t.Fatalf("reading one command's output grew the control plane's RSS by %d MiB", growth>>20)
	}
	if got.State != "succeeded" {
		t.Fatalf("commands get %s: %+v", cmd, got)
	}
}

// rssBytes is VmRSS of /proc/pid/status, in bytes.
func rssBytes(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Error(err)
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n << 10
		}
	}
	t.Error("no VmRSS in /proc/pid/status")
	return 0
}

// TestEventStreamsPerToken (issue 28): 20,000 event-stream requests from
// one token: 16 streams open, every other request is refused 429
// RESOURCE_EXHAUSTED with Retry-After, another token's calls keep
// answering throughout, and the CLI exits 1 saying how long to wait.
func TestEventStreamsPerToken(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	var tok struct {
		Token    string `json:"token"`
		APIToken struct {
			ID string `json:"id"`
		} `json:"apiToken"`
	}
	d.cliJSON(&tok, d.viaAPI("tokens", "create", "--role", "viewer", "--description", "event stream flood")...)
	flood := tok.Token
	if flood == "" {
		t.Fatalf("tokens create -o json gave no token: %+v", tok)
	}

	const requests, streams, workers = 20000, 16, 32
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: 0}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	var (
		mu      sync.Mutex
		open    []*http.Response
		refused atomic.Int64
		other   atomic.Int64
		noRetry atomic.Int64
		next    atomic.Int64
	)
	t.Cleanup(func() {
		for _, r := range open {
			r.Body.Close()
		}
	})
	// Another caller keeps calling while the flood runs.
	stopOther := make(chan struct{})
	otherDone := make(chan error, 1)
	var otherCalls atomic.Int64
	go func() {
		for {
			select {
			case <-stopOther:
				otherDone <- nil
				return
			default:
			}
			code, body := apiCall(hc, d.api, d.adminToken, "nodes.list", `{}`)
			if code != http.StatusOK {
				otherDone <- fmt.Errorf("nodes.list by another token during the flood: %d %s", code, body)
				return
			}
			otherCalls.Add(1)
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= requests {
				req, _ := http.NewRequest(http.MethodGet, d.api+"/api/events/watch", nil)
				req.Header.Set("Authorization", "Bearer "+flood)
				res, err := hc.Do(req)
				if err != nil {
					other.Add(1)
					continue
				}
				switch res.StatusCode {
				case http.StatusOK:
					mu.Lock()
					open = append(open, res)
					tooMany := len(open) > streams+8
					mu.Unlock()
					if tooMany {
						return // the old tree: every stream opens
					}
				case http.StatusTooManyRequests:
					var body struct{ Code string }
					_ = json.NewDecoder(res.Body).Decode(&body)
					res.Body.Close()
					if n, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || n < 1 || body.Code != "RESOURCE_EXHAUSTED" {
						noRetry.Add(1)
					}
					refused.Add(1)
				default:
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(stopOther)
	if err := <-otherDone; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	opened := len(open)
	mu.Unlock()
	t.Logf("%d event-stream requests in %s: %d open, %d refused 429; another token's %d calls answered meanwhile",
		requests, took.Round(time.Millisecond), opened, refused.Load(), otherCalls.Load())
	if opened != streams || refused.Load() != requests-streams || other.Load() != 0 || noRetry.Load() != 0 {
		t.Fatalf("%d open (want %d), %d refused 429 (want %d), %d other answers or errors, %d refusals without Retry-After or code",
			opened, streams, refused.Load(), requests-streams, other.Load(), noRetry.Load())
	}
	if otherCalls.Load() == 0 {
		t.Fatal("another token's calls made no progress during the flood")
	}
	// The CLI, refused: exit 1 and how long to wait.
	code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, "--config", d.cfgFile, "events", "watch", "--server", d.api, "--token", flood)
	if code != 1 || !strings.Contains(stderr, "RESOURCE_EXHAUSTED") || !strings.Contains(stderr, "try again in 10s") {
		t.Fatalf("events watch over the cap: exit %d\n%s%s\nwant exit 1, RESOURCE_EXHAUSTED and \"try again in 10s\"", code, stdout, stderr)
	}
	// A stream closed frees its place.
	open[0].Body.Close()
	eventually(t, 30*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodGet, d.api+"/api/events/watch", nil)
		req.Header.Set("Authorization", "Bearer "+flood)
		res, err := hc.Do(req)
		if err != nil {
			return false
		}
		if res.StatusCode == http.StatusOK {
			open = append(open, res)
			return true
		}
		res.Body.Close()
		return false
	}, func() string { return "a closed stream's place is not given back" })
}

// apiCall POSTs body to method with token and returns the status and body.
func apiCall(hc *http.Client, api, token, method, body string) (int, string) {
	group, name, _ := strings.Cut(method, ".")
	req, _ := http.NewRequest(http.MethodPost, api+"/api/"+group+"/"+name, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestSlowBodyCut (issue 28): a request body trickled a byte a second is
// cut at host.limits.bodyReadTimeout (2 s here; 30 s by default, checked by
// the config package's TestDefaults), with a token and without one; the
// connection closes, and a body that arrives in time is served.
func TestSlowBodyCut(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{host: "  limits:\n    bodyReadTimeout: 2s\n"})
	addr := strings.TrimPrefix(d.api, "http://")
	for _, tc := range []struct{ name, auth string }{
		{"with a token", "Authorization: Bearer " + d.adminToken + "\r\n"},
		{"without a token", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const body = `{}                                                                                                `
			head := fmt.Sprintf("POST /api/nodes/list HTTP/1.1\r\nHost: %s\r\nX-Better-Compute: 1\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n",
				addr, tc.auth, len(body))
			if _, err := c.Write([]byte(head)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			closed := make(chan []byte, 1)
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
				b, _ := io.ReadAll(c)
				closed <- b
			}()
			var answer []byte
		trickle:
			for i := 0; i < len(body); i++ {
				select {
				case answer = <-closed:
					break trickle
				case <-time.After(time.Second):
				}
				if _, err := c.Write([]byte{body[i]}); err != nil {
					answer = <-closed
					break
				}
			}
			took := time.Since(start)
			status := ""
			if line, _, ok := bytes.Cut(answer, []byte("\r\n")); ok {
				status = string(line)
			}
			t.Logf("a body trickled a byte a second: connection closed after %s (%q)", took.Round(10*time.Millisecond), status)
			if took < timeout-200*time.Millisecond || took > timeout+8*time.Second {
				t.Fatalf("the connection closed after %s, want about %s", took, timeout)
			}
		})
	}
	// A whole body in time is served.
	hc := &http.Client{Timeout: 30 * time.Second}
	if code, body := apiCall(hc, d.api, d.adminToken, "nodes.list", `{}`); code != http.StatusOK {
		t.Fatalf("nodes.list: %d %s", code, body)
	}
}
