package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/bcd/doctor"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
)

func TestDoctorBeforeJoin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := sessiontest.NewPKI(t)
	gw := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(p.NewToken(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// Not joined yet: the identity fails, but the gateway checks run with
	// the token's pin.
	r := bcd(ctx, "", nil, "doctor", "--data-dir", dir, "--gateway", gw.URL, "--token-file", tokenFile,
		"--plugin-dir", filepath.Join(dir, "plugins"), "-o", "json")
	if r.code != exitFailure || !strings.Contains(r.stderr, "doctor: 1 check(s) failed") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var rep doctor.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v in %s", err, r.stdout)
	}
	got := map[string]doctor.Status{}
	for _, c := range rep.Checks {
		got[c.ID] = c.Status
	}
	for id, st := range map[string]doctor.Status{doctor.IDIdentity: doctor.Fail, doctor.IDJoinToken: doctor.OK, doctor.IDDNS: doctor.OK,
		doctor.IDTCP: doctor.OK, doctor.IDTLS: doctor.Warn, doctor.IDGatewayTime: doctor.OK} {
		if got[id] != st {
			t.Errorf("%s = %s, want %s (%+v)", id, got[id], st, rep.Checks)
		}
	}

	// Joined: the table names every check, and none fails.
	gw.AddToken(strings.TrimSpace(readFile(t, tokenFile)))
	if r := bcd(ctx, "", nil, "join", "--gateway", gw.URL, "--token-file", tokenFile, "--data-dir", dir); r.code != 0 {
		t.Fatalf("join: %d %s", r.code, r.stderr)
	}
	r = bcd(ctx, "", nil, "doctor", "--data-dir", dir, "--plugin-dir", filepath.Join(dir, "plugins"))
	for _, id := range []string{"identity", "node.certificate", "gateway.tls", "gateway.clock", "nvml", "helper", "plugins"} {
		if !strings.Contains(r.stdout, id) {
			t.Errorf("table lacks %s:\n%s", id, r.stdout)
		}
	}
	if r.code != exitOK {
		t.Fatalf("doctor: exit %d: %s", r.code, r.stderr)
	}
	if r := bcd(ctx, "", nil, "doctor", "-o", "yaml"); r.code != exitUsage {
		t.Fatalf("-o yaml: exit %d", r.code)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
