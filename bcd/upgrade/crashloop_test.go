package upgrade

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// upgradeTo installs version with a passing trial and returns the
// restarted bcd's first Upgrader, connected.
func (e *upgradeEnv) upgradeTo(from, to string) {
	e.t.Helper()
	e.releases[to] = newRelease(e.t, e.key, to, script(to, true), time.Hour)
	if res := e.upgrader(from).Upgrade(context.Background(), upgradeCmd("cmd_"+to, to)); res != nil {
		e.t.Fatalf("upgrade: %v", res)
	}
	if err := e.upgrader(from).Handover(context.Background()); err == nil || !strings.Contains(err.Error(), "exec stub") {
		e.t.Fatalf("handover: %v", err)
	}
	<-e.execs
	u := e.upgrader(to)
	if probation, err := u.Resume(context.Background()); !probation || err != nil {
		e.t.Fatalf("first start of %s: %v %v", to, probation, err)
	}
	u.Connected()
}

func TestCrashLoopRollsBack(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	old := readFileT(t, e.target)
	e.upgradeTo("0.1.0", "0.2.0")
	if e.upgrader("0.2.0").LocalRollback() != nil {
		t.Fatal("a report before any rollback")
	}
	// Start 1 connected and exited; starts 2 and 3 exit too (counted by
	// the starts after them); start 4 rolls back.
	for start := 2; start <= 3; start++ {
		if probation, err := e.upgrader("0.2.0").Resume(context.Background()); probation || err != nil {
			t.Fatalf("start %d: %v %v", start, probation, err)
		}
		if readFileT(t, e.target) == old {
			t.Fatalf("rolled back at start %d", start)
		}
	}
	_, err := e.upgrader("0.2.0").Resume(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exec stub") {
		t.Fatalf("start 4: %v, want a restart", err)
	}
	if args := <-e.execs; args[0] != e.target {
		t.Fatalf("exec %v", args)
	}
	if readFileT(t, e.target) != old {
		t.Fatal("the previous binary is not back")
	}
	// The restored bcd reports it until a Welcome answers.
	u := e.upgrader("0.1.0")
	if probation, err := u.Resume(context.Background()); probation || err != nil {
		t.Fatalf("restored start: %v %v", probation, err)
	}
	r := u.LocalRollback()
	if r.GetFromVersion() != "0.2.0" || r.GetToVersion() != "0.1.0" || r.GetStarts() != 3 || !strings.Contains(r.GetReason(), "3 starts of 0.2.0") {
		t.Fatalf("report %v", r)
	}
	if u.PreviousVersion() != "0.2.0" {
		t.Errorf("previous version %q, want 0.2.0 (kept beside the restored binary)", u.PreviousVersion())
	}
	u.Connected()
	if u.LocalRollback() != nil {
		t.Fatal("report left after a Welcome")
	}
	if _, err := os.Stat(filepath.Join(e.dir, "data", "upgrade", watchFile)); !os.IsNotExist(err) {
		t.Fatalf("watch left: %v", err)
	}
}

func TestCrashLoopWatchEnds(t *testing.T) {
	t.Parallel()
	t.Run("clean stops do not count", func(t *testing.T) {
		e := newUpgradeEnv(t)
		e.upgradeTo("0.1.0", "0.2.0")
		for start := 2; start <= 6; start++ {
			u := e.upgrader("0.2.0")
			if _, err := u.Resume(context.Background()); err != nil {
				t.Fatalf("start %d: %v", start, err)
			}
			u.Stopped()
		}
	})
	t.Run("after the window", func(t *testing.T) {
		e := newUpgradeEnv(t)
		e.upgradeTo("0.1.0", "0.2.0")
		path := filepath.Join(e.dir, "data", "upgrade", watchFile)
		var w watch
		if err := json.Unmarshal([]byte(readFileT(t, path)), &w); err != nil {
			t.Fatal(err)
		}
		w.Since = w.Since.Add(-DefaultCrashLoopWindow - time.Second)
		w.Starts = 10
		b, _ := json.Marshal(w)
		writeFileT(t, path, b, 0o600)
		if _, err := e.upgrader("0.2.0").Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("watch left after its window: %v", err)
		}
	})
	t.Run("another binary", func(t *testing.T) {
		e := newUpgradeEnv(t)
		e.upgradeTo("0.1.0", "0.2.0")
		for range 4 {
			if _, err := e.upgrader("0.3.0").Resume(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
