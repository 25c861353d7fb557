package tests

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// doctorResult is one check of `doctor -o json`.
type doctorResult struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Hint   string `json:"hint"`
}

// doctor runs the real binary and returns its exit code and checks by id.
func doctorRun(t *testing.T, d *deployment, args ...string) (int, map[string]doctorResult) {
	t.Helper()
	code, out, errOut := testenv.Run(t, d.env, "", d.bc, append([]string{"--config", d.cfgFile, "doctor", "-o", "json"}, args...)...)
	var res struct {
		Checks []doctorResult `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Checks) == 0 {
		t.Fatalf("doctor -o json: %v\n%s%s", err, out, errOut)
	}
	m := map[string]doctorResult{}
	for _, c := range res.Checks {
		m[c.ID] = c
	}
	return code, m
}

// doctor on PostgreSQL, against a real serve: healthy first, then each
// condition made in the database is reported.
func TestDoctorFindsProblems(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeployment(t, backendPostgres)
	var code int
	var checks map[string]doctorResult
	eventually(t, 20*time.Second, func() bool {
		code, checks = doctorRun(t, d, "--strict")
		return code == 0
	}, func() string { return "doctor --strict on a healthy deployment: " + stringify(checks) })

	// A stopped sweeper: its lease expired and a command is overdue.
	d.serve.Kill()
	pool, err := d.st.PoolGet(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	n, err := d.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_silent", PoolID: pool.ID, Hostname: "silent"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.st.NodeSetState(ctx, n.ID, store.NodeReady); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-10 * time.Minute)
	if _, _, err := d.st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: n.ID, SessionID: "s-old", GatewayID: "gw-x", Now: &old}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{n.ID}, Kind: "exec", SessionSpec: []byte(`{}`), Timeout: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// A gateway near its stream limit.
	if _, err := d.st.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw-busy", Region: "default", Sessions: 95, MaxStreams: 100}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Second) // the killed serve's sweeper lease (15 s) expires
	code, checks = doctorRun(t, d)
	if code == 0 {
		t.Fatalf("doctor exited 0 with a stopped sweeper: %s", stringify(checks))
	}
	for id, want := range map[string]string{"workers.sweeper": "fail", "fleet.heartbeats": "warn", "fleet.gateway-headroom": "warn"} {
		if got := checks[id]; got.Status != want || got.Hint == "" {
			t.Fatalf("%s = %+v, want %s with a hint (all: %s)", id, got, want, stringify(checks))
		}
	}
}

func stringify(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// doctorOn runs doctor -o json with env and args (flags such as --config,
// --data-dir, --strict) and returns its exit code and checks by id.
func doctorOn(t *testing.T, env []string, args ...string) (int, map[string]doctorResult) {
	t.Helper()
	code, out, errOut := testenv.Run(t, env, "", testenv.Binary(t, "better-compute"), append([]string{"doctor", "-o", "json"}, args...)...)
	var res struct {
		Checks []doctorResult `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Checks) == 0 {
		t.Fatalf("doctor -o json %v: %v\n%s%s", args, err, out, errOut)
	}
	m := map[string]doctorResult{}
	for _, c := range res.Checks {
		m[c.ID] = c
	}
	return code, m
}

// TestDoctorStrictAfterDev: doctor --strict exits 0 right after the
// README's dev command (api.tls warned "plain HTTP on 0.0.0.0:3000" beside
// every dev, which listens on 127.0.0.1: issue 41). A serve of the same
// configuration whose API listens on every address still warns.
func TestDoctorStrictAfterDev(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	t.Run("dev passes", func(t *testing.T) {
		t.Parallel()
		dataDir := t.TempDir()
		p := testenv.Start(t, testenv.BaseEnv(), bin, "dev", "--sim", "3", "--port", "0", "--gateway-port", "0", "--data-dir", dataDir)
		p.WaitLine(`3 simulated daemons connected`, 120*time.Second)
		var checks map[string]doctorResult
		eventually(t, 30*time.Second, func() bool {
			var code int
			code, checks = doctorOn(t, nil, "--data-dir", dataDir, "--strict")
			return code == 0
		}, func() string { return "doctor --strict beside dev: " + stringify(checks) })
		if c := checks["api.tls"]; c.Status != "ok" || !strings.Contains(c.Hint, "loopback only") {
			t.Fatalf("api.tls beside dev = %+v, want ok on loopback only", c)
		}
	})
	t.Run("every address warns", func(t *testing.T) {
		t.Parallel()
		dataDir := t.TempDir()
		startServeConfig(t, []string{"BETTER_COMPUTE_DATA_DIR=" + dataDir}, "host:\n  listen: 0.0.0.0:0\n  gateway:\n    listen: 127.0.0.1:0\n")
		code, checks := doctorOn(t, nil, "--data-dir", dataDir, "--strict")
		if c := checks["api.tls"]; code == 0 || c.Status != "warn" || !strings.Contains(c.Hint, "clear text") {
			t.Fatalf("doctor --strict beside a plain-HTTP API on every address: exit %d, api.tls %+v; want exit 1 and a warning", code, c)
		}
	})
}

// TestDoctorInternalByRole: one configuration for every process names the
// gateway's internal address; the api's internal certificate (pki
// issue-internal with no --dns, as the command's help says an api-only
// process needs) does not name it. host.gateway.internal passes for the
// api (it failed before issue 41) and for a worker process, and fails for
// a gateway that would serve with that certificate.
func TestDoctorInternalByRole(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + pgtest.URL(t), "BETTER_COMPUTE_SECRET=" + testSecret, "BETTER_COMPUTE_DATA_DIR=" + t.TempDir()}
	tlsFiles := testenv.InitPostgresPKI(t, env, e2eTrustDomain)
	dir := t.TempDir()
	if code, out, errOut := testenv.Run(t, env, "", bin, "pki", "issue-internal", "--name", "api-1", "--out-dir", dir); code != 0 {
		t.Fatalf("pki issue-internal: exit %d\n%s%s", code, out, errOut)
	}
	cfg := testenv.WriteFile(t, "better-compute.yaml", "host:\n  gateway:\n"+tlsFiles+
		"    internal:\n      address: gw-1.internal:8444\n      tlsFiles:\n        cert: "+filepath.Join(dir, "internal.crt")+"\n        key: "+filepath.Join(dir, "internal.key")+"\n")
	for roles, want := range map[string]string{"api": "ok", "controllers,scheduler,sinks,iam": "ok", "gateway": "fail"} {
		_, checks := doctorOn(t, env, "--config", cfg, "--roles", roles)
		if c := checks["host.gateway.internal"]; c.Status != want {
			t.Errorf("doctor --roles %s: host.gateway.internal = %+v, want %s", roles, c, want)
		}
	}
}

// TestDoctorNotifierByRole: through PgBouncer without database.notifyURL,
// host.gateway.notifier fails for a gateway (LISTEN hears nothing there)
// and passes for a controllers and scheduler process, which LISTENs for
// nothing.
func TestDoctorNotifierByRole(t *testing.T) {
	t.Parallel()
	_, bouncer := pgtest.Database(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + bouncer, "BETTER_COMPUTE_SECRET=" + testSecret, "BETTER_COMPUTE_DATA_DIR=" + t.TempDir()}
	if code, out, errOut := testenv.Run(t, env, "", testenv.Binary(t, "better-compute"), "migrate"); code != 0 {
		t.Fatalf("migrate through PgBouncer: exit %d\n%s%s", code, out, errOut)
	}
	for roles, want := range map[string]string{"controllers,scheduler": "ok", "gateway": "fail"} {
		_, checks := doctorOn(t, env, "--roles", roles)
		if c := checks["host.gateway.notifier"]; c.Status != want {
			t.Errorf("doctor --roles %s through PgBouncer without notifyURL: host.gateway.notifier = %+v, want %s", roles, c, want)
		}
	}
}
