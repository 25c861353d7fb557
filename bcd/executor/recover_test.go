package executor_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/executor"
	"github.com/better-compute/better-compute/bcd/journal"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// fakeProc is a machine's processes for the recognition rules.
type fakeProc struct {
	mu      sync.Mutex
	boot    string
	procs   map[int]*fakeProcess // by pid
	signals []string             // "TERM 42", in order
}

type fakeProcess struct {
	start      uint64
	pgrp       int
	ignoreTerm bool
}

func (p *fakeProc) BootID() (string, error) {
	if p.boot == "" {
		return "", os.ErrNotExist
	}
	return p.boot, nil
}

func (p *fakeProc) StartTime(pid int) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.procs[pid]
	if !ok {
		return 0, fmt.Errorf("process %d: %w", pid, os.ErrNotExist)
	}
	return pr.start, nil
}

func (p *fakeProc) GroupAlive(pgid int) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.procs {
		if pr.pgrp == pgid {
			return true, nil
		}
	}
	return false, nil
}

func (p *fakeProc) KillGroup(pgid int, sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	name := map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGKILL: "KILL"}[sig]
	p.signals = append(p.signals, fmt.Sprintf("%s %d", name, pgid))
	found := false
	for pid, pr := range p.procs {
		if pr.pgrp != pgid {
			continue
		}
		found = true
		if sig == syscall.SIGKILL || !pr.ignoreTerm {
			delete(p.procs, pid)
		}
	}
	if !found {
		return syscall.ESRCH
	}
	return nil
}

func (p *fakeProc) sent() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.signals...)
}

func openJournal(t *testing.T, dir string) *journal.Journal {
	t.Helper()
	j, err := journal.Open(journal.Config{Path: filepath.Join(dir, journal.File), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestRecognitionRules: a new Executor judges each command an earlier bcd
// left unfinished in the journal.
func TestRecognitionRules(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j := openJournal(t, dir)
	accept := func(id, kind, boot string, pgid int, start uint64) {
		t.Helper()
		if err := j.Accept(journal.Record{ID: id, Kind: kind, BootID: boot, AcceptedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if pgid != 0 {
			if err := j.Started(id, pgid, start); err != nil {
				t.Fatal(err)
			}
		}
	}
	accept("rebooted", "exec", "boot-old", 100, 5)           // another boot: never signalled
	accept("reboot", sessionv1.KindReboot, "boot-old", 0, 0) // the reboot it asked for happened
	accept("reboot-pending", sessionv1.KindReboot, "boot-now", 0, 0)
	accept("no-process", "inventory.refresh", "boot-now", 0, 0)
	accept("reused", "exec", "boot-now", 200, 7)    // pid 200 now started at 8: another process
	accept("gone", "exec", "boot-now", 300, 9)      // nothing left of group 300
	accept("alive", "exec", "boot-now", 400, 11)    // still running: ended with SIGTERM
	accept("stubborn", "exec", "boot-now", 500, 13) // ignores SIGTERM: SIGKILL
	accept("orphans", "exec", "boot-now", 600, 15)  // leader gone, children in its group live
	if err := j.Accept(journal.Record{ID: "finished", Kind: "exec", BootID: "boot-now"}); err != nil {
		t.Fatal(err)
	}
	if err := j.Finished("finished", &sessionv1.CommandResult{CommandId: "finished", State: sessionv1.CommandState_COMMAND_STATE_FAILED, ExitCode: 2}); err != nil {
		t.Fatal(err)
	}
	proc := &fakeProc{boot: "boot-now", procs: map[int]*fakeProcess{
		100: {start: 5, pgrp: 100}, // same pid and start in the new boot: still not ours
		200: {start: 8, pgrp: 200},
		400: {start: 11, pgrp: 400}, 401: {start: 12, pgrp: 400},
		500: {start: 13, pgrp: 500, ignoreTerm: true},
		601: {start: 16, pgrp: 600},
	}}

	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Proc: proc, KillGrace: 50 * time.Millisecond, Logger: testLogger(t)})
	e.Wait()
	got := map[string]*sessionv1.CommandResult{}
	for _, r := range e.PendingResults() {
		got[r.GetCommandId()] = r
	}
	lost := sessionv1.CommandState_COMMAND_STATE_LOST
	for id, want := range map[string]struct {
		state sessionv1.CommandState
		err   string
	}{
		"rebooted":       {lost, "the node rebooted while the command ran"},
		"reboot":         {sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, ""},
		"reboot-pending": {lost, "bcd restarted while the command ran; it may have partly run"},
		"no-process":     {lost, "bcd restarted while the command ran; it may have partly run"},
		"reused":         {lost, "bcd restarted while the command ran; it may have partly run"},
		"gone":           {lost, "bcd restarted while the command ran; it may have partly run"},
		"alive":          {lost, "the process group it left behind was ended"},
		"stubborn":       {lost, "the process group it left behind was ended"},
		"orphans":        {lost, "the process group it left behind was ended"},
		"finished":       {sessionv1.CommandState_COMMAND_STATE_FAILED, ""},
	} {
		r := got[id]
		if r.GetState() != want.state || !strings.Contains(r.GetError(), want.err) || (want.err == "" && r.GetError() != "") {
			t.Errorf("%s: result %v, want %v %q", id, r, want.state, want.err)
		}
	}
	if d := string(got["reboot"].GetDetailJson()); !strings.Contains(d, `"boot_id_after":"boot-now"`) {
		t.Errorf("reboot detail = %s", d)
	}
	signals := strings.Join(proc.sent(), ", ")
	for _, want := range []string{"TERM 400", "TERM 500", "KILL 500", "TERM 600"} {
		if !strings.Contains(signals, want) {
			t.Errorf("signals %q lack %q", signals, want)
		}
	}
	for _, never := range []string{" 100", " 200", " 300", "KILL 400"} {
		if strings.Contains(signals, never) {
			t.Errorf("signals %q include %q", signals, never)
		}
	}
	if _, err := proc.StartTime(200); err != nil {
		t.Errorf("the process that reused pid 200 was touched: %v", err)
	}

	// A redelivery is answered with the recorded result and runs nothing.
	r := newRecorder()
	e.HandleCommand(context.Background(), execCmd("alive", "sh", "-c", "echo ran again"), r.send)
	if res := wait(t, r); res.GetState() != lost || r.output() != "" {
		t.Fatalf("redelivery of a recovered command: %v, output %q", res, r.output())
	}
}

// Without a boot id nothing can be matched: nothing is signalled.
func TestRecognitionWithoutBootID(t *testing.T) {
	t.Parallel()
	j := openJournal(t, t.TempDir())
	if err := j.Accept(journal.Record{ID: "c", Kind: "exec", BootID: "boot-now"}); err != nil {
		t.Fatal(err)
	}
	if err := j.Started("c", 400, 11); err != nil {
		t.Fatal(err)
	}
	proc := &fakeProc{procs: map[int]*fakeProcess{400: {start: 11, pgrp: 400}}}
	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Proc: proc, Logger: testLogger(t)})
	e.Wait()
	p := e.PendingResults()
	if len(p) != 1 || p[0].GetState() != sessionv1.CommandState_COMMAND_STATE_LOST || len(proc.sent()) != 0 {
		t.Fatalf("pending %v, signals %v", p, proc.sent())
	}
}

// A command is in the journal before its program starts, and its result
// once delivered is not sent again unasked after a restart, but still
// answers a redelivery.
func TestJournalBeforeStartAndAfterDelivery(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j := openJournal(t, dir)
	proc := &fakeProc{boot: "boot-now"}
	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Proc: executor.ProcFS("/proc"), Logger: testLogger(t)})
	r := newRecorder()
	e.HandleCommand(context.Background(), execCmd("cmd_seen", "cat", filepath.Join(dir, journal.File)), r.send)
	if res := wait(t, r); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || !strings.Contains(r.output(), `"id":"cmd_seen"`) {
		t.Fatalf("the command did not find itself in the journal: %v %q", res, r.output())
	}
	// A result that found no session is kept across the restart ...
	off := newRecorder()
	off.closed = true
	e.HandleCommand(context.Background(), execCmd("cmd_off", "true"), off.send)
	e.Wait()
	if p := e.PendingResults(); len(p) != 1 || p[0].GetCommandId() != "cmd_off" {
		t.Fatalf("pending = %v", p)
	}
	for _, rec := range j.Records() {
		if rec.ID == "cmd_seen" && (rec.PGID == 0 || rec.StartTicks == 0 || !rec.Delivered) {
			t.Fatalf("record of cmd_seen = %+v", rec)
		}
	}
	j.Close()

	j = openJournal(t, dir)
	e = executor.New(executor.Config{Commands: asSelf{}, Journal: j, Proc: proc, Logger: testLogger(t)})
	p := e.PendingResults()
	if len(p) != 1 || p[0].GetCommandId() != "cmd_off" || p[0].GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("pending after restart = %v", p)
	}
	// ... until a Welcome answers the Hello that carried it.
	e.Delivered(p)
	j.Close()
	j = openJournal(t, dir)
	e = executor.New(executor.Config{Commands: asSelf{}, Journal: j, Proc: proc, Logger: testLogger(t)})
	if p := e.PendingResults(); len(p) != 0 {
		t.Fatalf("delivered results pending again: %v", p)
	}
	r = newRecorder()
	e.HandleCommand(context.Background(), execCmd("cmd_seen", "sh", "-c", "echo again"), r.send)
	if res := wait(t, r); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || r.output() != "" {
		t.Fatalf("redelivery after restarts: %v %q", res, r.output())
	}
}

// recordedUpgrader answers from the record the restarted bcd found.
type recordedUpgrader struct{ calls int }

func (u *recordedUpgrader) Upgrade(context.Context, *sessionv1.Command) *sessionv1.CommandResult {
	u.calls++
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, DetailJson: []byte(`{"from":"a","to":"b"}`)}
}

// An upgrade handed to the restarted bcd is the Upgrader's to answer, not
// reported lost.
func TestHandedOverUpgradeGoesToTheUpgrader(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j := openJournal(t, dir)
	up := &sessionv1.Command{Id: "cmd_up", Kind: sessionv1.KindUpgrade, Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{Version: "restart"}}}
	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Upgrader: upgrader{}, Proc: &fakeProc{boot: "b"}})
	e.HandleCommand(context.Background(), up, newRecorder().send)
	e.Wait()
	j.Close()

	u := &recordedUpgrader{}
	e = executor.New(executor.Config{Commands: asSelf{}, Journal: openJournal(t, dir), Upgrader: u, Proc: &fakeProc{boot: "b"}})
	if p := e.PendingResults(); len(p) != 0 {
		t.Fatalf("a handed-over upgrade was reported at start: %v", p)
	}
	r := newRecorder()
	e.HandleCommand(context.Background(), up, r.send)
	if res := wait(t, r); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || u.calls != 1 {
		t.Fatalf("redelivered upgrade: %v after %d calls", res, u.calls)
	}
}

// TestDiskFullRefusesCommands: a command the journal has no room to record
// (journal.ErrDiskFull) is not run and fails with "disk full on the node's
// data dir" (issue 29); the journal keeps nothing of it.
func TestDiskFullRefusesCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j, err := journal.Open(journal.Config{Path: filepath.Join(dir, journal.File), Reserve: 1 << 62, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Proc: &fakeProc{}, Logger: testLogger(t)})
	r := newRecorder()
	marker := filepath.Join(dir, "ran")
	e.HandleCommand(context.Background(), execCmd("cmd_full", "touch", marker), r.send)
	res := wait(t, r)
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.GetError(), "disk full on the node's data dir") {
		t.Errorf("result on a full disk: %v, want failed naming the disk full", res)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran")
	}
	if rs := j.Records(); len(rs) != 0 {
		t.Errorf("the journal holds %+v", rs)
	}
}
