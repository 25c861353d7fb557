package tests

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
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
