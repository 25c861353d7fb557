package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/tests/testenv"
)

// rawGet sends "GET target" to addr exactly as written (no client cleans
// or escapes it) and returns the status code and the body.
func rawGet(t *testing.T, addr, target string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestProbeEdgesRefused (issue 29, item 8), against a real serve: a raw
// ".." (or "." or an empty segment) in a download path answers 400
// INVALID_ARGUMENT as docs/install.md promises, not a 307 to the cleaned
// path; an install-script parameter that does not parse (a raw ";") or is
// unknown answers 400 INVALID_ARGUMENT naming it, not 200 with the
// defaults; sinks.replay of a sink that is not configured, with all or
// with ids, is NOT_FOUND (exit 1 from the CLI), not 200.
func TestProbeEdgesRefused(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		top: fmt.Sprintf("downloads:\n  dir: %s\nsinks:\n  files:\n    - name: archive\n      path: %s\n",
			t.TempDir(), filepath.Join(t.TempDir(), "events.jsonl")),
	})
	addr := strings.TrimPrefix(d.api, "http://")
	code := func(body string) (string, string) {
		var e struct{ Code, Field, Message string }
		_ = json.Unmarshal([]byte(body), &e)
		return e.Code, e.Field
	}
	for _, target := range []string{
		"/api/downloads/bcd/../../secret",
		"/api/downloads/bcd/0.1.0/../linux-amd64",
		"/api/downloads/bcd/./0.1.0/linux-amd64",
		"/api/downloads/bcd//0.1.0/linux-amd64",
		"/api/downloads/..",
	} {
		status, body := rawGet(t, addr, target)
		if c, _ := code(body); status != http.StatusBadRequest || c != "INVALID_ARGUMENT" {
			t.Errorf("GET %s: %d %s, want 400 INVALID_ARGUMENT", target, status, body)
		}
	}
	// A clean path still reaches the downloads handler (no such file: 404).
	if status, body := rawGet(t, addr, "/api/downloads/bcd/0.1.0/linux-amd64"); status != http.StatusNotFound {
		t.Errorf("GET a clean download path: %d %s, want 404", status, body)
	}

	for target, field := range map[string]string{
		"/api/install.sh?unprivileged=';id;'": "unprivileged",
		"/api/install.sh?unprivileged=yes":    "unprivileged",
		"/api/install.sh?version=1;2":         "version",
		"/api/install.sh?colour=blue":         "colour",
		"/api/install.sh?transport=%zz":       "transport",
	} {
		status, body := rawGet(t, addr, target)
		if c, f := code(body); status != http.StatusBadRequest || c != "INVALID_ARGUMENT" || f != field {
			t.Errorf("GET %s: %d %s, want 400 INVALID_ARGUMENT naming %s", target, status, body, field)
		}
	}

	for _, args := range [][]string{
		{"sinks", "replay", "--sink", "no-such-sink", "--all"},
		{"sinks", "replay", "--sink", "no-such-sink", "1"},
	} {
		c, stdout, stderr := testenv.Run(t, d.env, "", d.bc, append([]string{"--config", d.cfgFile}, d.viaAPI(args...)...)...)
		if c != 1 || !strings.Contains(stderr, "no sink") || !strings.Contains(stderr, "no-such-sink") {
			t.Errorf("better-compute %s: exit %d, %s%s; want exit 1 and NOT_FOUND naming the sink", strings.Join(args, " "), c, stdout, stderr)
		}
	}
	// The configured sink with nothing dead: replayed none, exit 0.
	d.cli(d.viaAPI("sinks", "replay", "--sink", "archive", "--all")...)
}

// apiPost calls method over HTTP with token and returns the status and the
// raw body.
func apiPost(t *testing.T, d *deployment, method, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, d.api+"/api/"+strings.ReplaceAll(method, ".", "/"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestCommandEnvHiddenFromViewers (issue 29, item 7): an exec command's
// environment may hold credentials. A viewer reading it (commands.get,
// commands.list, and the CLI's get in table and JSON form) sees the
// variables' names only; an operator and an admin see the values.
func TestCommandEnvHiddenFromViewers(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	tokenFile, _ := d.joinToken(1, time.Hour)
	fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: d.gatewayURL, Token: strings.TrimSpace(readFile(t, tokenFile)),
		N: 1, NamePrefix: "env", NoInventory: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	node := fl.Daemons()[0].NodeID()
	const name, value = "API_KEY_29", "s3cr3t-value-of-issue-29"
	status, body := apiPost(t, d, "commands.create", d.adminToken,
		fmt.Sprintf(`{"nodeIds":[%q],"kind":"exec","exec":{"argv":["true"],"env":{%q:%q}}}`, node, name, value))
	var created struct{ Commands []struct{ ID string } }
	if err := json.Unmarshal([]byte(body), &created); status != http.StatusOK || err != nil || len(created.Commands) != 1 {
		t.Fatalf("commands.create: %d %s", status, body)
	}
	id := created.Commands[0].ID
	token := func(role string) string {
		return strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", role)...))
	}
	viewer, operator := token("viewer"), token("operator")

	for _, read := range []struct{ method, body string }{
		{"commands.get", fmt.Sprintf(`{"id":%q}`, id)},
		{"commands.list", fmt.Sprintf(`{"nodeId":%q}`, node)},
	} {
		status, body := apiPost(t, d, read.method, viewer, read.body)
		if status != http.StatusOK || strings.Contains(body, value) || !strings.Contains(body, name) {
			t.Errorf("viewer's %s: %d %s; want the variable's name and not its value", read.method, status, body)
		}
		for role, tok := range map[string]string{"operator": operator, "admin": d.adminToken} {
			if status, body := apiPost(t, d, read.method, tok, read.body); status != http.StatusOK || !strings.Contains(body, value) {
				t.Errorf("%s's %s: %d %s; want the variable's value", role, read.method, status, body)
			}
		}
	}
	for _, out := range []string{"table", "json"} {
		stdout := d.cli("commands", "get", id, "--server", d.api, "--token", viewer, "-o", out)
		if strings.Contains(stdout, value) {
			t.Errorf("viewer's commands get -o %s shows the value:\n%s", out, stdout)
		}
	}
}

// TestCLIEscapesNodeText (issue 29, item 5): a node whose hostname carries
// a right-to-left override and whose label carries bidirectional isolates
// and a zero-width space (the gateway refuses control characters in
// labels, not these) is shown by the CLI's tables and plain text (nodes list, nodes
// get) with those characters escaped, while -o json keeps them exactly.
func TestCLIEscapesNodeText(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	tokenFile, _ := d.joinToken(1, time.Hour)
	const hostname, label = "evil\u202egnp.exe", "ok\u2066\u202etxt.exe\u2069\u200b"
	fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: hostname, Labels: map[string]string{"note": label}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fd.Join(t.Context(), d.gatewayURL, strings.TrimSpace(readFile(t, tokenFile))); err != nil {
		t.Fatal(err)
	}
	node := fd.NodeID()
	raw := func(s string) bool { return strings.ContainsAny(s, "\u202e\u2066\u2069\u200b\x1b") }
	for _, args := range [][]string{{"nodes", "list"}, {"nodes", "get", node}} {
		out := d.cli(d.viaAPI(args...)...)
		if raw(out) || !strings.Contains(out, `evil\u202egnp.exe`) {
			t.Errorf("better-compute %s printed:\n%q\nwant the hostname escaped (evil\\u202egnp.exe) and no raw control or override character", strings.Join(args, " "), out)
		}
	}
	if out := d.cli(d.viaAPI("nodes", "get", node)...); !strings.Contains(out, `ok\u2066\u202etxt.exe\u2069\u200b`) {
		t.Errorf("nodes get shows the label as:\n%q\nwant it escaped", out)
	}
	// -o json is the API's answer: the strings decode exactly.
	out := d.cli(d.viaAPI("nodes", "get", node, "-o", "json")...)
	var got any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("nodes get -o json: %v\n%s", err, out)
	}
	found := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case string:
			found[x] = true
		}
	}
	walk(got)
	if !found[hostname] || !found[label] {
		t.Errorf("nodes get -o json does not hold the hostname and the label exactly:\n%s", out)
	}
}
