package tests

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestAsRootNeedsAdmin (issue 27, "Root is one right"): an operator's exec
// with asRoot is refused with 403 PERMISSION_DENIED, through the API and
// the CLI, audited, and nothing is written or run; an admin's runs as root
// on a real bcd, and the command's record says asRoot.
func TestAsRootNeedsAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeployment(t, backendSQLite)
	ids, _ := fleetOf(t, d, 1)
	node := ids[0]
	opSecret, opTok, err := iam.Create(ctx, d.st, iam.CreateParams{Role: store.RoleOperator, Description: "root right operator"})
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran-as-root")
	op := &client.Client{BaseURL: d.api + "/api", Token: opSecret}
	wantRefused(t, "an operator's asRoot exec", func() error {
		_, err := op.CommandsCreate(ctx, &apiv1.CreateCommandsRequest{NodeIds: []string{node}, Kind: "exec",
			Exec: &apiv1.ExecSpec{Argv: []string{"touch", marker}, AsRoot: true}})
		return err
	}, 403)
	code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, "--config", d.cfgFile, "commands", "run", "--node", node, "--as-root",
		"--server", d.api, "--token", opSecret, "--", "touch", marker)
	t.Logf("an operator's commands run --as-root: exit %d\n%s%s", code, stdout, stderr)
	if code != 1 || !strings.Contains(stderr, "PERMISSION_DENIED") || !strings.Contains(stderr, "admin") {
		t.Fatalf("an operator's commands run --as-root: exit %d\n%s%s; want exit 1, PERMISSION_DENIED naming the admin role", code, stdout, stderr)
	}
	denied := 0
	for _, e := range auditRows(t, d, "commands.create") {
		if e.Actor == "token:"+opTok.ID && e.Outcome == "PERMISSION_DENIED" {
			denied++
		}
	}
	if denied != 2 {
		t.Fatalf("%d commands.create audit rows refusing the operator, want 2", denied)
	}
	var list struct {
		Commands []json.RawMessage `json:"commands"`
	}
	d.cliJSON(&list, d.viaAPI("commands", "list")...)
	if len(list.Commands) != 0 {
		t.Fatalf("commands after the refusals: %s, want none", list.Commands)
	}
	// The operator without asRoot is allowed: the refusal is about root.
	if _, err := op.CommandsCreate(ctx, &apiv1.CreateCommandsRequest{NodeIds: []string{node}, Kind: "exec",
		Exec: &apiv1.ExecSpec{Argv: []string{"true"}}}); err != nil {
		t.Fatalf("an operator's exec without asRoot: %v", err)
	}

	// The admin's runs as root, and its record says so.
	id := d.runNoWait(node, []string{"--as-root"}, "id", "-u")
	var c struct {
		commandView
		Exec struct {
			AsRoot bool `json:"asRoot"`
		} `json:"exec"`
	}
	eventually(t, 30*time.Second, func() bool {
		d.cliJSON(&c, d.viaAPI("commands", "get", id)...)
		return c.State == "succeeded" || c.State == "failed"
	}, func() string { return "the admin's asRoot command never finished: " + c.State })
	if c.State != "succeeded" || strings.TrimSpace(c.Stdout) != "0" || !c.Exec.AsRoot {
		t.Fatalf("the admin's asRoot id -u: %+v, want succeeded, 0, exec.asRoot true", c)
	}
	if out := d.cli(d.viaAPI("commands", "get", id)...); !regexp.MustCompile(`(?m)^as root\s+yes$`).MatchString(out) {
		t.Fatalf("commands get %s does not say it ran as root:\n%s", id, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the operator's refused command ran")
	}
}
