package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// jsonShape flattens a JSON document into sorted "path type" lines
// ("nodes[].labels.rack string"), so that a test states the field names
// and types of an output without its ids and times. Array elements share
// the path "[]".
func jsonShape(t *testing.T, doc string) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, doc)
	}
	seen := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			seen[path+" object"] = true
			for k, e := range x {
				walk(strings.TrimPrefix(path+"."+k, "."), e)
			}
		case []any:
			seen[path+" array"] = true
			for _, e := range x {
				walk(path+"[]", e)
			}
		case string:
			seen[path+" string"] = true
		case float64:
			seen[path+" number"] = true
		case bool:
			seen[path+" bool"] = true
		case nil:
			seen[path+" null"] = true
		}
	}
	walk("", v)
	var out []string
	for k := range seen {
		out = append(out, strings.TrimSpace(k))
	}
	sort.Strings(out)
	return out
}

// wantShape fails unless every line of want is in got (got may hold more:
// the test names what scripts rely on).
func wantShape(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s -o json: no %q in its shape:\n%s", what, w, strings.Join(got, "\n"))
		}
	}
}

// TestJSONShapes: every -o json prints the API's protojson: list commands
// the list response ({"nodes": [...], "nextCursor"}), lowerCamelCase
// names, command output as text with a separate base64 field only for
// output that is not UTF-8, the inventory as an object. The nodes get
// table shows labels, clock skew, the boot id and the inventory summary.
func TestJSONShapes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	_, pool := mustSitePool(t, st, "s", "p")
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_js", PoolID: pool.ID, Hostname: "gpu-1",
		Labels: map[string]string{"rack": "r1"}}); err != nil {
		t.Fatal(err)
	}
	inv := `{"digest":"d1","host":{"hostname":"gpu-1","os":{"name":"debian","version":"12","kernel":"6.1.0-18-amd64"},
		"cpu":{"model":"AMD EPYC 9654","sockets":2,"cores":192,"threads":384},"memory":{"totalBytes":"1099511627776"}},
		"gpus":[{"index":0,"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-a","memoryTotalBytes":"85899345920"},
		{"index":1,"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-b","memoryTotalBytes":"85899345920"}],
		"collectedAt":"2026-01-02T03:04:05Z"}`
	if err := st.NodeSetInventory(ctx, "node_js", []byte(inv), "d1"); err != nil {
		t.Fatal(err)
	}
	const bootID = "6d3f1e2a-0b4c-4e5f-9a8b-7c6d5e4f3a2b"
	if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_js", SessionID: "sess_js", GatewayID: "gw", BootID: bootID}); err != nil {
		t.Fatal(err)
	}
	c := apiCLI(t, st, strings.Repeat("s", 32), mustToken(t, st, store.RoleAdmin))

	wantShape(t, "nodes list", jsonShape(t, c.ok("nodes", "list", "-o", "json")),
		"nodes array", "nodes[].id string", "nodes[].poolId string", "nodes[].labels.rack string",
		"nodes[].gpus[].name string", "nodes[].gpus[].memoryTotalBytes string", "nodes[].createTime string")
	got := jsonShape(t, c.ok("nodes", "get", "node_js", "-o", "json"))
	wantShape(t, "nodes get", got, "id string", "labels.rack string", "inventory object", "inventory.host.cpu.model string",
		"inventory.host.cpu.cores number", "inventory.host.memory.totalBytes string", "inventory.host.os.kernel string",
		"inventory.gpus[].name string", "inventory.collectedAt string", "bootId string")
	if slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "inventoryJson") }) {
		t.Errorf("nodes get -o json still has inventoryJson:\n%s", strings.Join(got, "\n"))
	}
	table := c.ok("nodes", "get", "node_js")
	for _, re := range []string{`(?m)^labels\s+rack=r1$`, `(?m)^clock skew\s+-$`, `(?m)^boot id\s+` + bootID + `$`, `(?m)^cpu\s+AMD EPYC 9654 \(2 sockets, 192 cores, 384 threads\)$`,
		`(?m)^memory\s+1024\.0 GiB$`, `(?m)^gpus\s+2x NVIDIA H100 80GB HBM3 \(80 GiB\)$`, `(?m)^os\s+debian 12$`, `(?m)^kernel\s+6\.1\.0-18-amd64$`} {
		if !regexp.MustCompile(re).MatchString(table) {
			t.Errorf("nodes get table: no line matching %s:\n%s", re, table)
		}
	}

	var created struct {
		Commands []struct {
			ID string `json:"id"`
		} `json:"commands"`
	}
	if err := json.Unmarshal([]byte(c.ok("commands", "run", "--node", "node_js", "--no-wait", "-o", "json", "--", "echo", "hi")), &created); err != nil ||
		len(created.Commands) != 1 {
		t.Fatalf("commands run --no-wait: %+v", created)
	}
	id := created.Commands[0].ID
	notUTF8 := []byte{0xff, 0xfe, 'x', '\n'}
	for i, ch := range []*store.CommandOutputChunk{
		{CommandID: id, Seq: 1, Stream: store.StreamStdout, Data: []byte("héllo\n")},
		{CommandID: id, Seq: 2, Stream: store.StreamStderr, Data: notUTF8},
	} {
		if _, err := st.CommandAppendOutput(ctx, ch); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
	}
	out := c.ok("commands", "get", id, "-o", "json")
	wantShape(t, "commands get", jsonShape(t, out), "id string", "nodeId string", "state string", "stdout string",
		"stderrBase64 string", "exec.argv array", "createTime string")
	var cmd struct {
		Stdout       string `json:"stdout"`
		StdoutBase64 string `json:"stdoutBase64"`
		Stderr       string `json:"stderr"`
		StderrBase64 string `json:"stderrBase64"`
	}
	if err := json.Unmarshal([]byte(out), &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.Stdout != "héllo\n" || cmd.StdoutBase64 != "" || cmd.Stderr != "" || cmd.StderrBase64 != base64.StdEncoding.EncodeToString(notUTF8) {
		t.Errorf("commands get -o json output fields: %+v", cmd)
	}
	// For people, bytes that are not UTF-8 are escaped (issue 29); -o json
	// above carries them exactly.
	if table := c.ok("commands", "get", id); !strings.Contains(table, "--- stdout\nhéllo\n--- stderr\n"+escapeText(string(notUTF8), true)) {
		t.Errorf("commands get table output:\n%q", table)
	}
	wantShape(t, "commands list", jsonShape(t, c.ok("commands", "list", "-o", "json")), "commands array", "commands[].id string",
		"commands[].kind string")
	wantShape(t, "tokens list", jsonShape(t, c.ok("tokens", "list", "-o", "json")), "apiTokens array", "apiTokens[].id string",
		"apiTokens[].role string", "apiTokens[].createTime string")
	for _, list := range []struct{ args, want []string }{
		{[]string{"sites", "list"}, []string{"sites array", "sites[].id string", "sites[].name string", "sites[].createTime string"}},
		{[]string{"pools", "list"}, []string{"pools array", "pools[].id string", "pools[].siteId string", "pools[].createTime string"}},
	} {
		wantShape(t, strings.Join(list.args, " "), jsonShape(t, c.ok(append(list.args, "-o", "json")...)), list.want...)
	}
}
