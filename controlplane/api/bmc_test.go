package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/proto/bmcsecret"
)

// withNode adds a site, a pool and the node node_bmc.
func (f *fixture) withNode() string {
	f.t.Helper()
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		f.t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_bmc", PoolID: pool.ID, Hostname: "h"}); err != nil {
		f.t.Fatal(err)
	}
	return "node_bmc"
}

func TestBMCCommandsCreate(t *testing.T) {
	f := newFixture(t)
	node := f.withNode()
	ctx := context.Background()
	for _, tc := range []struct{ body, kind, spec string }{
		// Stored in the session-protocol form, a power.* kind's action set.
		{`{"nodeIds":["node_bmc"],"kind":"power.status"}`, "power.status", `{"power":{"action":"status"}}`},
		{`{"nodeIds":["node_bmc"],"kind":"power.soft-off","power":{"bmc":"rack1-u07"}}`, "power.soft-off", `{"power":{"bmc":"rack1-u07","action":"soft-off"}}`},
		{`{"nodeIds":["node_bmc"],"kind":"boot.set","boot":{"device":"pxe","persistent":true}}`, "boot.set", `{"boot":{"device":"pxe","persistent":true}}`},
	} {
		r := f.call("commands.create", f.admin, tc.body, peer)
		if r.Code != 200 {
			t.Fatalf("%s: %v", tc.body, r)
		}
		cmds := r.Body["commands"].([]any)
		id := cmds[0].(map[string]any)["id"].(string)
		c, err := f.st.CommandGet(ctx, id)
		if err != nil || c.Kind != tc.kind || c.NodeID != node {
			t.Fatalf("%s: stored %+v %v", tc.body, c, err)
		}
		var got, want any
		_ = json.Unmarshal(c.SessionSpec, &got)
		_ = json.Unmarshal([]byte(tc.spec), &want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: spec %s, want %s", tc.body, c.SessionSpec, tc.spec)
		}
	}
	for _, tc := range []struct{ body, field string }{
		{`{"nodeIds":["node_bmc"],"kind":"boot.set"}`, "boot"},
		{`{"nodeIds":["node_bmc"],"kind":"boot.set","boot":{"device":"floppy"}}`, "boot.device"},
		{`{"nodeIds":["node_bmc"],"kind":"power.on","boot":{"device":"pxe"}}`, "boot"},
		{`{"nodeIds":["node_bmc"],"kind":"exec","exec":{"argv":["x"]},"power":{}}`, "power"},
		{`{"nodeIds":["node_bmc"],"kind":"power.on","power":{"bmc":"a b"}}`, "power.bmc"},
		{`{"nodeIds":["node_bmc"],"kind":"power.on","exec":{"argv":["x"]}}`, "exec"},
		{`{"nodeIds":["node_bmc"],"kind":"power.explode"}`, "kind"},
	} {
		wantCode(t, f.call("commands.create", f.admin, tc.body, peer), 400, apiv1.CodeInvalidArgument, tc.field)
	}

	// commands.get shows the spec and the node's result.
	r := f.call("commands.create", f.admin, `{"nodeIds":["node_bmc"],"kind":"power.off","power":{"bmc":"r1"}}`, peer)
	id := r.Body["commands"].([]any)[0].(map[string]any)["id"].(string)
	code := 0
	if _, err := f.st.CommandFinish(ctx, &store.CommandFinishParams{ID: id, State: store.CommandSucceeded, ExitCode: &code,
		Result: []byte(`{"bmc":"10.0.0.1","name":"r1","action":"off","power":"off","provider":"ipmitool"}`)}); err != nil {
		t.Fatal(err)
	}
	got := f.call("commands.get", f.admin, `{"id":"`+id+`"}`, peer).Body["command"].(map[string]any)
	if res, _ := got["result"].(map[string]any); res["power"] != "off" || got["power"].(map[string]any)["bmc"] != "r1" {
		t.Fatalf("commands.get: %v", got)
	}
}

func TestBMCSetCredentials(t *testing.T) {
	f := newFixture(t)
	node := f.withNode()
	ctx := context.Background()
	const password = "Sup3r-s3cret-BMC-pw"
	body := `{"nodeId":"node_bmc","address":"10.1.2.3","username":"admin","password":"` + password + `","ipmiPort":6230,"timeout":"5s"}`

	// Only admins.
	operator := f.token(store.RoleOperator, 0)
	wantCode(t, f.call("bmc.setCredentials", operator, body, peer), 403, apiv1.CodePermissionDenied, "")

	r := f.call("bmc.setCredentials", f.admin, body, peer)
	if r.Code != 200 || r.Body["secretName"] != "bmc/"+node || r.Body["address"] != "10.1.2.3" {
		t.Fatalf("setCredentials: %v", r)
	}
	raw, _ := json.Marshal(r.Body)
	if strings.Contains(string(raw), password) {
		t.Fatalf("the answer holds the password: %s", raw)
	}

	// Stored sealed for the node, under the secret's AAD, as the
	// bmcsecret format.
	s, err := f.st.SecretGet(ctx, "bmc/"+node)
	if err != nil || s.NodeID != node || strings.Contains(string(s.Sealed), password) {
		t.Fatalf("stored secret: %+v %v", s, err)
	}
	value, err := pki.Open(strings.Repeat("s", 32), s.Sealed, pki.SecretAAD("bmc/"+node))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := bmcsecret.Parse(value)
	if err != nil || creds.Password != password || creds.IPMIPort != 6230 || creds.Timeout != "5s" {
		t.Fatalf("sealed value: %v %v", creds, err)
	}

	// The audit rows (the refused operator's included) hold neither the
	// password nor a digest of a body that holds it.
	entries, err := f.st.AuditList(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	withPW := sha256.Sum256([]byte(body))
	audited := 0
	for _, e := range entries {
		row := fmt.Sprintf("%+v %s", e, e.Details)
		if strings.Contains(row, password) || strings.Contains(row, fmt.Sprintf("%x", withPW)) {
			t.Errorf("audit row holds the password or its body's digest: %s", row)
		}
		if e.Action == "bmc.setCredentials" {
			audited++
			if e.Outcome == "ok" && e.Resource != node {
				t.Errorf("audit resource %q, want %s", e.Resource, node)
			}
		}
	}
	if audited != 2 {
		t.Errorf("%d bmc.setCredentials audit rows, want 2 (denied and ok)", audited)
	}

	// Refusals name the field, never the password.
	for _, tc := range []struct{ body, field string }{
		{`{"nodeId":"node_none","address":"10.1.2.3","username":"u","password":"` + password + `"}`, "nodeId"},
		{`{"nodeId":"node_bmc","address":"https://10.1.2.3","username":"u","password":"` + password + `"}`, "address"},
		{`{"nodeId":"node_bmc","address":"10.1.2.3","username":"u"}`, "password"},
		{`{"nodeId":"node_bmc","address":"10.1.2.3","username":"u","password":"` + password + `","providers":["snmp"]}`, "provider \"snmp\""},
	} {
		r := f.call("bmc.setCredentials", f.admin, tc.body, peer)
		if r.Code/100 != 4 || fmt.Sprint(r.Body["message"]) == "" || strings.Contains(fmt.Sprint(r.Body), password) {
			t.Errorf("%s: %v", tc.body, r)
		}
		if tc.field == "nodeId" {
			wantCode(t, r, 404, apiv1.CodeNotFound, "nodeId")
		}
	}

	if r := f.call("bmc.deleteCredentials", f.admin, `{"nodeId":"node_bmc"}`, peer); r.Code != 200 {
		t.Fatalf("deleteCredentials: %v", r)
	}
	if _, err := f.st.SecretGet(ctx, "bmc/"+node); err == nil {
		t.Fatal("the secret is still there")
	}
	wantCode(t, f.call("bmc.deleteCredentials", f.admin, `{"nodeId":"node_bmc"}`, peer), 404, apiv1.CodeNotFound, "nodeId")
}
