package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
	"github.com/jackc/pgx/v5"
)

// internalMetricsToken guards the gateways' /metrics listeners in the
// internal API tests.
const internalMetricsToken = "internal-api-metrics-token"

// internalAPIConfig issues the deployment's internal certificate (pki
// issue-internal, one for every process: it names 127.0.0.1, which each
// gateway advertises) and returns the configuration that turns the
// internal control API on, with a /metrics listener in every process.
func internalAPIConfig(t *testing.T) func(env []string) string {
	return func(env []string) string {
		dir := t.TempDir()
		bin := testenv.Binary(t, "better-compute")
		if code, stdout, stderr := testenv.Run(t, env, "", bin, "pki", "issue-internal", "--name", "cp-1", "--ip", "127.0.0.1",
			"--dns", "localhost", "--out-dir", dir); code != 0 {
			t.Fatalf("pki issue-internal: exit %d\n%s%s", code, stdout, stderr)
		}
		return fmt.Sprintf("    internal:\n      listen: 127.0.0.1:0\n      tlsFiles:\n        cert: %s\n        key: %s\n"+
			"  metrics:\n    bearerToken: %s\n    listen: 127.0.0.1:0\n",
			filepath.Join(dir, "internal.crt"), filepath.Join(dir, "internal.key"), internalMetricsToken)
	}
}

// wakeups reads bettercompute_gateway_wakeups_total from a process's
// /metrics listener, by source.
func wakeups(t *testing.T, metricsAddr string) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+internalMetricsToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	out := map[string]float64{}
	re := regexp.MustCompile(`(?m)^bettercompute_gateway_wakeups_total\{[^}]*source="(\w+)"[^}]*\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		out[m[1]] += v
	}
	return out
}

// TestInternalAPIWakesOnlyTheOwningGateway: in a split deployment on
// PostgreSQL (api and two gateways in separate processes) with the internal
// control API, a command created through the api wakes only the gateway
// holding the node's session, over the internal API; the other gateway gets
// no wake-up at all (no NOTIFY was sent). doctor checks the configuration.
func TestInternalAPIWakesOnlyTheOwningGateway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSplitDeploymentWith(t, 2, 0, internalAPIConfig(t))
	owner, other := d.gateways[0], d.gateways[1]
	metricsOf := map[*splitProc]string{}
	for _, g := range d.gateways {
		metricsOf[g] = g.p.WaitLine(`msg="Metrics listening" addr=(\S+)`, 30*time.Second)[1]
		g.p.WaitLine(`msg="Internal control API listening"`, 30*time.Second)
	}
	gws, err := d.st.GatewayList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range gws {
		if !strings.HasPrefix(row.InternalAddress, "127.0.0.1:") {
			t.Fatalf("gateway %s advertises internal address %q, want 127.0.0.1:<port>", row.ID, row.InternalAddress)
		}
	}

	m, nodeID := d.joinMachine("internal-01", owner)
	bcd := m.node()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bcd's output:\n%s", bcd.Output())
		}
	})
	d.waitSession(nodeID, owner)
	// The api's NOTIFYs, told from other deployments' by the sender's
	// backend pid: the tests' deployments share one database, and each
	// gateway's bus wake-ups count every NOTIFY on the channel.
	notifies := listenWake(t, d.url)
	before := map[*splitProc]map[string]float64{owner: wakeups(t, metricsOf[owner]), other: wakeups(t, metricsOf[other])}

	const commands = 3
	for i := range commands {
		resp := &apiv1.CreateCommandsResponse{}
		if err := d.admin.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: []string{nodeID}, Kind: "exec",
			Exec: &apiv1.ExecSpec{Argv: []string{"true"}}}, resp); err != nil {
			t.Fatal(err)
		}
		id := resp.GetCommands()[0].GetId()
		eventually(t, 30*time.Second, func() bool {
			c, err := d.st.CommandGet(ctx, id)
			return err == nil && c.State == store.CommandSucceeded
		}, func() string { return fmt.Sprintf("command %d (%s) did not succeed", i, id) })
	}
	after := map[*splitProc]map[string]float64{owner: wakeups(t, metricsOf[owner]), other: wakeups(t, metricsOf[other])}
	if got := after[owner]["internal"] - before[owner]["internal"]; got != commands {
		t.Errorf("owning gateway: %v internal wake-ups for %d commands, want %d", got, commands, commands)
	}
	if got := notifies(d.backendPIDs(t, "api")); got != 0 {
		t.Errorf("the api sent %d NOTIFYs on %s, want none (it should not NOTIFY when the internal API reached the owner)", got, wake.Channel)
	}
	if got := after[other]["internal"] - before[other]["internal"]; got != 0 {
		t.Errorf("other gateway: %v internal wake-ups, want none", got)
	}
	t.Logf("wake-ups: owner %v -> %v, other %v -> %v", before[owner], after[owner], before[other], after[other])

	// doctor sees the internal API configured, its certificate good and
	// both gateways advertising their addresses.
	env := append(d.env, "BETTER_COMPUTE_DATABASE_URL="+d.url)
	_, stdout, stderr := testenv.Run(t, env, "", d.bin, "doctor", "--config", d.cfgFile, "-o", "json")
	var rep struct {
		Checks []struct{ ID, Status, Hint string } `json:"checks"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("doctor -o json: %v\n%s%s", err, stdout, stderr)
	}
	found := false
	for _, c := range rep.Checks {
		if c.ID == "host.gateway.internal" {
			found = true
			if c.Status != "ok" {
				t.Errorf("doctor host.gateway.internal = %s: %s", c.Status, c.Hint)
			}
		}
	}
	if !found {
		t.Errorf("doctor has no host.gateway.internal check:\n%s", stdout)
	}
}

// listenWake LISTENs on the wake-up channel (wake.Channel) of the
// database at url until the test ends, and returns a function counting the
// notifications received so far from the backend pids given.
func listenWake(t *testing.T, url string) func(pids []uint32) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+wake.Channel); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var from []uint32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			from = append(from, n.PID)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; conn.Close(context.Background()) })
	return func(pids []uint32) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, p := range from {
			if slices.Contains(pids, p) {
				n++
			}
		}
		return n
	}
}

// backendPIDs returns the PostgreSQL backend pids of process name's
// connections (its application_name).
func (d *splitDeployment) backendPIDs(t *testing.T, name string) []uint32 {
	t.Helper()
	rows, err := d.db.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, d.app(name))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []uint32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		out = append(out, uint32(pid))
	}
	if len(out) == 0 {
		t.Fatalf("no database connection of process %s", name)
	}
	return out
}
