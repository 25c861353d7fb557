package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// commandView is a command as `commands get -o json` shows it.
type commandView struct {
	ID       string `json:"id"`
	NodeID   string `json:"nodeId"`
	State    string `json:"state"`
	ExitCode *int   `json:"exitCode"`
	Error    string `json:"error"`
	Stdout   string `json:"stdout"` // text; stdoutBase64 when not UTF-8
	Attempt  int    `json:"attempt"`
}

// fleetOf starts n real bcd nodes joined to d and waits until they are ready.
func fleetOf(t *testing.T, d *deployment, n int) ([]string, []*testenv.Proc) {
	t.Helper()
	tokenFile, _ := d.joinToken(n, time.Hour)
	ids := make([]string, n)
	procs := make([]*testenv.Proc, n)
	for i := range n {
		m := newMachine(t, fmt.Sprintf("node-%02d", i+1))
		ids[i] = m.mustJoin(d.gatewayURL, tokenFile)
		procs[i] = m.node()
	}
	for _, p := range procs {
		p.WaitLine(sessionEstablished.String(), 30*time.Second)
	}
	eventually(t, 15*time.Second, func() bool {
		nodes := d.nodes()
		for _, id := range ids {
			if n := nodes[id]; n.State != "ready" || n.GatewayID == "" {
				return false
			}
		}
		return true
	}, func() string { return "nodes not ready" })
	return ids, procs
}

// viaAPI adds the API's address and admin token to a CLI command's
// arguments, before any "--".
func (d *deployment) viaAPI(args ...string) []string {
	flags := []string{"--server", d.api, "--token", d.adminToken}
	for i, a := range args {
		if a == "--" {
			return append(append(append([]string{}, args[:i]...), flags...), args[i:]...)
		}
	}
	return append(args, flags...)
}

// command reads a command through the CLI.
func (d *deployment) command(id string) commandView {
	d.t.Helper()
	var c commandView
	d.cliJSON(&c, d.viaAPI("commands", "get", id)...)
	return c
}

// runNoWait creates an exec command on node and returns its id.
func (d *deployment) runNoWait(node string, extra []string, argv ...string) string {
	d.t.Helper()
	out := d.cli(d.viaAPI(append(append([]string{"commands", "run", "--no-wait", "--node", node}, extra...), append([]string{"--"}, argv...)...)...)...)
	id, _, _ := strings.Cut(strings.TrimSpace(out), "\t")
	if !strings.HasPrefix(id, "cmd_") {
		d.t.Fatalf("commands run --no-wait printed %q", out)
	}
	return id
}

func running(marker string) bool {
	out, _ := exec.Command("pgrep", "-f", marker).Output()
	return len(bytes.TrimSpace(out)) > 0
}

func TestCommandsEndToEnd(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		d := newDeployment(t, backend)
		ids, procs := fleetOf(t, d, 3)

		// commands run on the pool prints each node's output and exits 0.
		code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, d.viaAPI("--config", d.cfgFile, "commands", "run", "--pool", "default", "--", "uname", "-a")...)
		if code != 0 {
			t.Fatalf("commands run uname -a: exit %d\n%s%s", code, stdout, stderr)
		}
		for _, id := range ids {
			if !regexp.MustCompile(`(?m)^` + id + `: Linux `).MatchString(stdout) {
				t.Fatalf("no uname output from %s:\n%s", id, stdout)
			}
		}
		// A failing program makes commands run exit non-zero.
		if code, _, _ := testenv.Run(t, d.env, "", d.bc, d.viaAPI("--config", d.cfgFile, "commands", "run", "--node", ids[0], "--", "false")...); code != 1 {
			t.Fatalf("commands run false: exit %d, want 1", code)
		}

		// sleep 600 cancelled ends cancelled within 2 s and leaves no sleep.
		marker := fmt.Sprintf("600.%d%d", os.Getpid(), len(backend))
		sleeper := d.runNoWait(ids[1], nil, "sleep", marker)
		eventually(t, 10*time.Second, func() bool { return d.command(sleeper).State == "running" && running("sleep "+marker) },
			func() string { return "sleep never ran: " + d.command(sleeper).State })
		cancelled := time.Now()
		d.cli(d.viaAPI("commands", "cancel", sleeper)...)
		eventually(t, 2*time.Second, func() bool { return d.command(sleeper).State == "cancelled" },
			func() string { return "not cancelled within 2 s: " + d.command(sleeper).State })
		t.Logf("%s: sleep 600 cancelled in %v", backend, time.Since(cancelled).Round(time.Millisecond))
		if running("sleep " + marker) {
			t.Fatal("the cancelled sleep is still running")
		}

		// A gateway killed and restarted mid-dispatch runs no command twice
		// and leaves none unfinished.
		runs := sharedDir(t) // the command user writes there
		var batch []string
		for i, id := range ids[1:] {
			batch = append(batch, d.runNoWait(id, []string{"--timeout", "90s"}, "sh", "-c", fmt.Sprintf("echo ran >> %s/%d; sleep 1", runs, i)))
		}
		d.serve.Kill()
		d.start()
		for _, c := range batch {
			eventually(t, 60*time.Second, func() bool {
				s := d.command(c).State
				return s == "succeeded" || s == "failed" || s == "lost" || s == "expired"
			},
				func() string { return fmt.Sprintf("%s still %s", c, d.command(c).State) })
			if v := d.command(c); v.State != "succeeded" {
				t.Fatalf("command %s across the restart ended %s (%s)", c, v.State, v.Error)
			}
		}
		for i := range batch {
			b, _ := os.ReadFile(filepath.Join(runs, fmt.Sprint(i)))
			if n := strings.Count(string(b), "ran"); n != 1 {
				t.Fatalf("command %d ran %d times across the gateway restart", i, n)
			}
		}

		// A node killed mid-command: the command ends lost within the
		// sweeper's window (30 s without a session).
		lostMarker := fmt.Sprintf("601.%d%d", os.Getpid(), len(backend))
		victim := d.runNoWait(ids[2], nil, "sleep", lostMarker)
		eventually(t, 10*time.Second, func() bool { return d.command(victim).State == "running" },
			func() string { return "never running: " + d.command(victim).State })
		procs[2].Kill()
		killed := time.Now()
		t.Cleanup(func() { _ = exec.Command("pkill", "-f", "sleep "+lostMarker).Run() })
		eventually(t, 60*time.Second, func() bool { return d.command(victim).State == "lost" },
			func() string { return "not lost: " + d.command(victim).State })
		t.Logf("%s: command of a killed node lost %v after the kill", backend, time.Since(killed).Round(time.Second))
	})
}

// TestAPIOverHTTP checks the API's refusals against a real serve process.
func TestAPIOverHTTP(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		d := newDeployment(t, backend)
		call := func(method, token, body string, headers ...string) (int, map[string]any) {
			t.Helper()
			req, _ := http.NewRequest(http.MethodPost, d.api+"/api/"+strings.ReplaceAll(method, ".", "/"), strings.NewReader(body))
			if len(headers) == 0 || headers[0] != "no-csrf" {
				req.Header.Set("X-Better-Compute", "1")
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			for i := 0; i+1 < len(headers); i += 2 {
				req.Header.Set(headers[i], headers[i+1])
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("%s: body %q is not JSON", method, b)
			}
			return res.StatusCode, m
		}
		want := func(code int, body map[string]any, status int, errCode, field string) {
			t.Helper()
			if code != status || body["code"] != errCode || (field != "" && body["field"] != field) {
				t.Fatalf("got %d %v, want %d %s %q", code, body, status, errCode, field)
			}
		}
		token := func(role, ttl string) string {
			args := []string{"tokens", "create", "--role", role}
			if ttl != "" {
				args = append(args, "--ttl", ttl)
			}
			return strings.TrimSpace(d.cli(d.viaAPI(args...)...))
		}
		viewer := token("viewer", "")
		short := token("operator", "1s")

		code, body := call("commands.create", viewer, `{"pool":"default","kind":"exec","exec":{"argv":["id"]}}`)
		want(code, body, 403, "PERMISSION_DENIED", "")
		time.Sleep(1100 * time.Millisecond)
		code, body = call("nodes.list", short, `{}`)
		want(code, body, 401, "UNAUTHENTICATED", "")
		code, body = call("nodes.list", d.adminToken, `{}`, "no-csrf")
		want(code, body, 403, "PERMISSION_DENIED", "")
		code, body = call("sites.create", d.adminToken, `{"name":`)
		want(code, body, 400, "INVALID_ARGUMENT", "")
		code, body = call("sites.create", d.adminToken, `{"name":"x","region":"r","owner":"me"}`)
		want(code, body, 400, "INVALID_ARGUMENT", "owner")
		code, body = call("sites.create", d.adminToken, `{"name":"`+strings.Repeat("x", 2<<20)+`"}`)
		want(code, body, 400, "INVALID_ARGUMENT", "")
		code, body = call("commands.get", d.adminToken, `{"id":"../etc/passwd"}`)
		want(code, body, 400, "INVALID_ARGUMENT", "id")
		// X-Forwarded-For from an untrusted peer changes nothing: the audit
		// row names the socket peer.
		code, _ = call("sites.create", d.adminToken, `{"name":"xff","region":"r"}`, "X-Forwarded-For", "203.0.113.77")
		if code != 200 {
			t.Fatalf("sites.create: %d", code)
		}
		rows, err := d.st.AuditList(t.Context(), 0, 1000)
		if err != nil || len(rows) == 0 {
			t.Fatal(err)
		}
		if last := rows[len(rows)-1]; last.Action != "sites.create" || last.SourceIP != "127.0.0.1" {
			t.Fatalf("audit row %+v, want sites.create from 127.0.0.1", last)
		}
	})
}
