package upgrade

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func rollbackCmd(id string) *sessionv1.Command {
	return &sessionv1.Command{Id: id, Kind: sessionv1.KindRollback}
}

// TestRollbackCommand upgrades 0.1.0 to 0.2.0, then rolls back by command:
// the binary kept beside the installed one is restored without a download
// (the release is gone from the server), bcd restarts into it without a
// trial, and the restarted 0.1.0 answers the redelivery from the record. A
// second rollback is a no-op; a bcd that never upgraded has nothing to
// roll back to.
func TestRollbackCommand(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	old := readFileT(t, e.target)
	if res := e.upgrader("0.1.0").Rollback(context.Background(), rollbackCmd("cmd_r0")); res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED ||
		!strings.Contains(res.GetError(), "no previous bcd is kept") {
		t.Fatalf("rollback before any upgrade: %v", res)
	}
	e.releases["0.2.0"] = newRelease(t, e.key, "0.2.0", script("0.2.0", true), time.Hour)
	u := e.upgrader("0.1.0")
	if res := u.Upgrade(context.Background(), upgradeCmd("cmd_u", "0.2.0")); res != nil {
		t.Fatalf("upgrade: %v", res)
	}
	if err := u.Handover(context.Background()); err == nil {
		t.Fatal("handover returned without exec")
	}
	<-e.execs
	u2 := e.upgrader("0.2.0")
	if _, err := u2.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	u2.Connected()
	if v := u2.PreviousVersion(); v != "0.1.0" {
		t.Fatalf("previous version after the upgrade = %q, want 0.1.0", v)
	}
	delete(e.releases, "0.2.0") // a rollback downloads nothing
	delete(e.releases, "0.1.0")

	restarts := e.restarts.Load()
	if res := u2.Rollback(context.Background(), rollbackCmd("cmd_r1")); res != nil {
		t.Fatalf("rollback returned %v, want a restart", res)
	}
	if e.restarts.Load() != restarts+1 || readFileT(t, e.target) != old {
		t.Fatal("previous binary not restored, or no restart asked")
	}
	if res := u2.Rollback(context.Background(), rollbackCmd("cmd_r2")); res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED {
		t.Fatalf("a second rollback during the first: %v", res)
	}
	if err := u2.Handover(context.Background()); err == nil || !strings.Contains(err.Error(), "exec stub") {
		t.Fatalf("handover after rollback: %v", err)
	}
	if args := <-e.execs; args[0] != e.target {
		t.Fatalf("exec %v", args)
	}
	u3 := e.upgrader("0.1.0")
	if probation, err := u3.Resume(context.Background()); probation || err != nil {
		t.Fatalf("resume after a rollback: probation %v, %v (want none: the binary ran here before)", probation, err)
	}
	res := u3.Rollback(context.Background(), rollbackCmd("cmd_r1"))
	var d Detail
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || json.Unmarshal(res.GetDetailJson(), &d) != nil ||
		d != (Detail{From: "0.2.0", To: "0.1.0", RolledBack: true}) {
		t.Fatalf("redelivered rollback: %v", res)
	}
	u3.Connected()
	if res := u3.Rollback(context.Background(), rollbackCmd("cmd_r3")); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("rollback on the kept release already: %v", res)
	}
}
