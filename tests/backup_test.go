package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestBackupRestoreUnderLoad is issue 38's backup and restore: a backup
// taken while commands stream in; the original stopped and its data
// directory removed; restore refuses a wrong secret and a data directory
// in use, then restores into a fresh one, served on the same addresses:
// the real bcd and the FakeDaemons reconnect as the nodes they were, and
// the commands the backup holds read the same.
func TestBackupRestoreUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{gateway: "    drainDelay: 1s\n"})
	tokenFile, _ := d.joinToken(20, time.Hour)
	m := newMachine(t, "restored-real")
	realID := m.mustJoin(d.gatewayURL, tokenFile)
	identity := identityOf(t, m)
	bcd := m.node()
	bcd.WaitLine(sessionEstablished.String(), 30*time.Second)
	fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: d.gatewayURL, Token: strings.TrimSpace(readFile(t, tokenFile)), N: 10,
		NamePrefix: "restored", NoInventory: true,
		Session: session.Config{StartJitter: -1, BackoffBase: 200 * time.Millisecond, BackoffMax: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Join(ctx); err != nil {
		t.Fatal(err)
	}
	runDaemons(t, fl.Daemons())
	ids := []string{realID}
	for _, fd := range fl.Daemons() {
		ids = append(ids, fd.NodeID())
	}
	allReady := func() bool {
		n := d.nodes()
		for _, id := range ids {
			if n[id].State != "ready" {
				return false
			}
		}
		return len(n) == len(ids)
	}
	eventually(t, 60*time.Second, allReady, func() string { return fmt.Sprintf("nodes not ready: %v", d.nodes()) })

	// Commands stream in on every node while the backup is taken.
	admin := &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}
	loadCtx, stopLoad := context.WithCancel(ctx)
	var created atomic.Int64
	var loadErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		for loadCtx.Err() == nil {
			_, err := admin.CommandsCreate(loadCtx, &apiv1.CreateCommandsRequest{NodeIds: ids, Kind: "exec", Exec: &apiv1.ExecSpec{Argv: []string{"true"}}})
			if err != nil && loadCtx.Err() == nil {
				loadErr = err
				return
			}
			created.Add(int64(len(ids)))
		}
	})
	for created.Load() < int64(5*len(ids)) {
		time.Sleep(50 * time.Millisecond) // a poll for the load to be under way, not a wait for an outcome
	}
	file := filepath.Join(t.TempDir(), "backup.tar")
	out := d.cli("backup", "--out", file)
	during := created.Load()
	stopLoad()
	wg.Wait()
	if loadErr != nil {
		t.Fatalf("commands.create under the backup: %v", loadErr)
	}
	t.Logf("backup with %d commands created before it finished:\n%s", during, out)
	if !strings.Contains(out, "useless without it") {
		t.Errorf("backup does not say the file is useless without the secret:\n%s", out)
	}
	secret := d.secret()
	if b, err := os.ReadFile(file); err != nil || strings.Contains(string(b), secret) {
		t.Fatalf("the backup file holds the deployment secret (or cannot be read: %v)", err)
	}

	// The original stopped and its data directory removed.
	d.serve.Stop(syscall.SIGTERM, 30*time.Second)
	stopped := time.Now()
	if err := os.RemoveAll(d.dataDir); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), "restored")
	restore := func(env []string, dir string) (int, string, string) {
		return testenv.Run(t, env, "", d.bc, "restore", "--from", file, "--data-dir", dir)
	}
	if code, stdout, stderr := restore([]string{"BETTER_COMPUTE_SECRET=" + strings.Repeat("w", 40)}, fresh); code != 1 ||
		!strings.Contains(stderr, "does not open the PKI bundle") {
		t.Errorf("restore with a wrong secret: exit %d\n%s%s; want exit 1 saying the secret does not open the PKI bundle", code, stdout, stderr)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a restore refused for its secret wrote %s: %v", fresh, err)
	}
	used := t.TempDir()
	if err := os.WriteFile(filepath.Join(used, "state.db"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := restore([]string{"BETTER_COMPUTE_SECRET=" + secret}, used); code != 1 || !strings.Contains(stderr, "empty data directory") {
		t.Errorf("restore into a data directory that holds a database: exit %d\n%s%s; want exit 1", code, stdout, stderr)
	}
	if code, stdout, stderr := restore([]string{"BETTER_COMPUTE_SECRET=" + secret}, fresh); code != 0 {
		t.Fatalf("restore: exit %d\n%s%s", code, stdout, stderr)
	}

	// Served from the fresh data directory on the same addresses, with the
	// secret restore wrote there.
	d.dataDir = fresh
	d.env = []string{"BETTER_COMPUTE_DATA_DIR=" + fresh}
	d.start()
	st, err := backend.Open(ctx, "", fresh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eventually(t, 120*time.Second, func() bool {
		for _, id := range ids {
			s, err := st.SessionGet(ctx, id)
			if err != nil || s.ConnectedAt.Before(stopped) {
				return false
			}
		}
		return allReady()
	}, func() string { return fmt.Sprintf("nodes after the restore: %v", d.nodes()) })
	t.Logf("every node back %.1f s after serve stopped", time.Since(stopped).Seconds())
	if got := identityOf(t, m); got != identity {
		t.Errorf("the real bcd's identity is %s now, was %s: it joined again", got, identity)
	}
	cmds, err := st.CommandList(ctx, &store.CommandListParams{ListParams: store.ListParams{Limit: store.MaxListLimit}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) < 5*len(ids) {
		t.Errorf("%d commands after the restore, want at least the %d created before the backup began", len(cmds), 5*len(ids))
	}
	after := d.runNoWait(realID, nil, "echo", "after the restore")
	eventually(t, 30*time.Second, func() bool { return d.command(after).State == "succeeded" },
		func() string { return fmt.Sprintf("the command after the restore: %+v", d.command(after)) })
}
