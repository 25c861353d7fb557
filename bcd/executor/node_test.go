package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/executor"
	"github.com/better-compute/better-compute/bcd/journal"
	"github.com/better-compute/better-compute/proto/gpudiag"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

const gpuA = "GPU-5c1f0000-0000-0000-0000-00000000000a"

// fakeGPUs answers gpu.reset's questions and records the resets.
type fakeGPUs struct {
	mu    sync.Mutex
	procs map[string][]int
	reset []string
	// check is what Check answers; checks counts its calls.
	check  gpudiag.Result
	checks int
}

func (g *fakeGPUs) Check(_ context.Context, uuid string) (gpudiag.Result, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.checks++
	return g.check, nil
}

func (g *fakeGPUs) Processes(_ context.Context, uuid string) ([]int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.procs[uuid]
	if !ok {
		return nil, fmt.Errorf("processes of %s: no such GPU on this node", uuid)
	}
	return p, nil
}

func (g *fakeGPUs) ResetDone(uuid string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reset = append(g.reset, uuid)
}

// standInSMI writes an nvidia-smi stand-in into a directory put first on
// PATH: it appends its arguments to the returned log and exits with the
// status in the file status (0 when absent).
func standInSMI(t *testing.T) (log, status string) {
	dir := t.TempDir()
	log, status = filepath.Join(dir, "args"), filepath.Join(dir, "status")
	script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\necho 'GPU reset done'\n[ -f %s ] && exit $(cat %s)\nexit 0\n", log, status, status)
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return log, status
}

func gpuResetCmd(id, uuid string, force bool) *sessionv1.Command {
	return &sessionv1.Command{Id: id, Kind: sessionv1.KindGPUReset,
		Spec: &sessionv1.Command_GpuReset{GpuReset: &sessionv1.GPUResetSpec{GpuUuid: uuid, Force: force}}}
}

func TestGPUReset(t *testing.T) {
	args, status := standInSMI(t)
	victim := exec.Command("sleep", "600")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- victim.Wait() }()
	t.Cleanup(func() { _ = victim.Process.Kill() })

	gpus := &fakeGPUs{procs: map[string][]int{gpuA: nil, "GPU-0b": {victim.Process.Pid}}}
	refreshed := make(chan struct{}, 4)
	e := executor.New(executor.Config{Commands: asSelf{}, GPUs: gpus, IsRoot: func() bool { return true },
		RefreshInventory: func(context.Context) error { refreshed <- struct{}{}; return nil }})
	run := func(c *sessionv1.Command) (*sessionv1.CommandResult, *recorder) {
		t.Helper()
		r := newRecorder()
		e.HandleCommand(t.Context(), c, r.send)
		return wait(t, r), r
	}
	calls := func() string {
		b, _ := os.ReadFile(args)
		return string(b)
	}

	// An idle GPU is reset, the collector is told, the inventory sent.
	res, r := run(gpuResetCmd("reset_1", gpuA, false))
	if res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || calls() != "-r -i "+gpuA+"\n" ||
		!strings.Contains(r.output(), "GPU reset done") || len(gpus.reset) != 1 || len(refreshed) != 1 {
		t.Fatalf("idle GPU: %v, nvidia-smi %q, output %q, resets %v", res, calls(), r.output(), gpus.reset)
	}

	// A GPU in use is refused without force, and nvidia-smi is not run.
	res, _ = run(gpuResetCmd("reset_2", "GPU-0b", false))
	if res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.Error, "in use by processes") ||
		strings.Count(calls(), "\n") != 1 {
		t.Fatalf("GPU in use: %v, nvidia-smi %q", res, calls())
	}
	// With force its processes are killed first, then it is reset.
	res, _ = run(gpuResetCmd("reset_3", "GPU-0b", true))
	if res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || !strings.HasSuffix(calls(), "-r -i GPU-0b\n") {
		t.Fatalf("forced reset: %v, nvidia-smi %q", res, calls())
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the GPU's process was not killed")
	}

	// nvidia-smi failing fails the command, and the GPU's health holds.
	if err := os.WriteFile(status, []byte("3"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, _ = run(gpuResetCmd("reset_4", gpuA, false))
	if res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || res.ExitCode != 3 || len(gpus.reset) != 2 {
		t.Fatalf("failed nvidia-smi: %v, resets %v", res, gpus.reset)
	}
	for _, bad := range []string{"GPU-nope-on-this-node", "-h", "GPU-;rm"} {
		res, _ = run(gpuResetCmd("reset_bad"+bad, bad, false))
		if res.State != sessionv1.CommandState_COMMAND_STATE_FAILED {
			t.Errorf("gpu.reset of %q: %v", bad, res)
		}
	}
	if n := strings.Count(calls(), "\n"); n != 3 {
		t.Errorf("nvidia-smi ran %d times, want 3:\n%s", n, calls())
	}

	// Without the node's GPUs, or without root, it fails clearly.
	e2 := executor.New(executor.Config{Commands: asSelf{}, IsRoot: func() bool { return false }, GPUs: gpus})
	r2 := newRecorder()
	e2.HandleCommand(t.Context(), gpuResetCmd("reset_5", gpuA, false), r2.send)
	if res := wait(t, r2); res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.Error, "root helper") {
		t.Errorf("unprivileged without helper: %v", res)
	}
}

// fakeRebooter records reboots.
type fakeRebooter struct {
	mu     sync.Mutex
	calls  int
	called chan struct{} // closed at the first call
}

func (f *fakeRebooter) Reboot(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls == 1 {
		close(f.first())
	}
	return nil
}

// first returns the channel closed at the first call; f.mu is held.
func (f *fakeRebooter) first() chan struct{} {
	if f.called == nil {
		f.called = make(chan struct{})
	}
	return f.called
}

// awaitCall waits for the first Reboot: the executor reports running
// before it asks for the reboot.
func (f *fakeRebooter) awaitCall(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	ch := f.first()
	f.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("the reboot was never asked for")
	}
}

func (f *fakeRebooter) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// A reboot is recorded before it is done and is never repeated: bcd
// stops with the reboot under way, the bcd of the next boot answers the
// redelivered command from its journal with SUCCEEDED.
func TestRebootIsNotRepeated(t *testing.T) {
	path := filepath.Join(t.TempDir(), journal.File)
	j, err := journal.Open(journal.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	rb := &fakeRebooter{}
	proc := &fakeProc{boot: "boot-1", procs: map[int]*fakeProcess{}}
	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Reboot: rb, Proc: proc})
	ctx, stop := context.WithCancel(t.Context())
	r := newRecorder()
	cmd := &sessionv1.Command{Id: "reboot_1", Kind: sessionv1.KindReboot}
	e.HandleCommand(ctx, cmd, r.send)
	r.await(t, "the reboot to start", started)
	rb.awaitCall(t)
	if rb.n() != 1 {
		t.Fatalf("reboots: %d", rb.n())
	}
	stop() // the machine goes down: systemd stops bcd
	e.Wait()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if res := e.PendingResults(); len(res) != 0 {
		t.Fatalf("a result before the reboot happened: %v", res)
	}

	j, err = journal.Open(journal.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	proc2 := &fakeProc{boot: "boot-2", procs: map[int]*fakeProcess{}}
	rb2 := &fakeRebooter{}
	e2 := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Reboot: rb2, Proc: proc2})
	r2 := newRecorder()
	e2.HandleCommand(t.Context(), cmd, r2.send)
	res := wait(t, r2)
	if res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || !strings.Contains(string(res.DetailJson), "boot-2") || rb2.n() != 0 {
		t.Fatalf("redelivered after the reboot: %v, reboots %d", res, rb2.n())
	}
	e2.Wait()

	// Without a journal a reboot is refused; a deadline that passes with
	// the machine still up expires it.
	e3 := executor.New(executor.Config{Commands: asSelf{}, Reboot: rb})
	r3 := newRecorder()
	e3.HandleCommand(t.Context(), &sessionv1.Command{Id: "reboot_2", Kind: sessionv1.KindReboot}, r3.send)
	if res := wait(t, r3); res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.Error, "journal") {
		t.Errorf("reboot without a journal: %v", res)
	}
	e4 := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Reboot: rb, Proc: proc2})
	r4 := newRecorder()
	e4.HandleCommand(t.Context(), &sessionv1.Command{Id: "reboot_3", Kind: sessionv1.KindReboot,
		Deadline: timestamppb.New(time.Now().Add(200 * time.Millisecond))}, r4.send)
	if res := wait(t, r4); res.State != sessionv1.CommandState_COMMAND_STATE_EXPIRED {
		t.Errorf("reboot that did not happen: %v", res)
	}
}

// As root without a Rebooter, a reboot runs RebootCommand, its program
// looked up in bcd's own PATH first (where a test's stand-in systemctl
// is), and then waits for the machine to go down without a result.
func TestRebootRunsSystemctlFromPATH(t *testing.T) {
	dir := t.TempDir()
	asked := filepath.Join(dir, "asked")
	if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >> "+asked+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	j, err := journal.Open(journal.Config{Path: filepath.Join(t.TempDir(), journal.File)})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	proc := &fakeProc{boot: "boot-1", procs: map[int]*fakeProcess{}}
	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Proc: proc, IsRoot: func() bool { return true }})
	ctx, stop := context.WithCancel(t.Context())
	r := newRecorder()
	e.HandleCommand(ctx, &sessionv1.Command{Id: "reboot_1", Kind: sessionv1.KindReboot}, r.send)
	r.await(t, "the reboot to start", started)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(asked); string(b) == "reboot\n" {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(asked)
			t.Fatalf("the stand-in systemctl was asked %q, want reboot", b)
		}
	}
	stop() // the machine goes down
	e.Wait()
	if res := e.PendingResults(); len(res) != 0 {
		t.Fatalf("a result before the reboot happened: %v", res)
	}
}

// A drain waits for the running commands and refuses new exec commands
// meanwhile; once it ends the node takes them again.
func TestDrain(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	gate := filepath.Join(t.TempDir(), "gate")
	long := newRecorder()
	e.HandleCommand(t.Context(), execCmd("long", "sh", "-c", "while [ ! -f "+gate+" ]; do sleep 0.05; done"), long.send)
	long.await(t, "the long command to start", started)

	drain := newRecorder()
	e.HandleCommand(t.Context(), &sessionv1.Command{Id: "drain_1", Kind: sessionv1.KindDrain}, drain.send)
	drain.await(t, "the drain to start", started)

	refused := newRecorder()
	e.HandleCommand(t.Context(), execCmd("new", "true"), refused.send)
	if res := wait(t, refused); res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.Error, "draining") {
		t.Fatalf("exec while draining: %v", res)
	}
	select {
	case res := <-drain.result:
		t.Fatalf("drain ended while a command ran: %v", res)
	default:
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := wait(t, long); res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("long command: %v", res)
	}
	res := wait(t, drain)
	if res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || !strings.Contains(string(res.DetailJson), `"long"`) {
		t.Fatalf("drain: %v", res)
	}
	after := newRecorder()
	e.HandleCommand(t.Context(), execCmd("after", "true"), after.send)
	if res := wait(t, after); res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("exec after the drain: %v", res)
	}

	// A drain whose deadline passes names what still runs.
	stuck := newRecorder()
	e.HandleCommand(t.Context(), execCmd("stuck", "sleep", "600"), stuck.send)
	stuck.await(t, "the stuck command to start", started)
	late := newRecorder()
	e.HandleCommand(t.Context(), &sessionv1.Command{Id: "drain_2", Kind: sessionv1.KindDrain,
		Deadline: timestamppb.New(time.Now().Add(300 * time.Millisecond))}, late.send)
	if res := wait(t, late); res.State != sessionv1.CommandState_COMMAND_STATE_EXPIRED || !strings.Contains(res.Error, "stuck") {
		t.Fatalf("drain past its deadline: %v (stuck: %v)", res, stuck.updates)
	}
	e.HandleCancel(t.Context(), &sessionv1.Cancel{CommandId: "stuck"})
	e.Wait()
}

// standInDCGMI writes a dcgmi stand-in first on PATH that logs its arguments
// and prints the file doc (DCGM's JSON), exiting with status.
func standInDCGMI(t *testing.T, doc string, status int) (log string) {
	dir := t.TempDir()
	log = filepath.Join(dir, "args")
	if err := os.WriteFile(filepath.Join(dir, "doc.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\ncat %s\nexit %d\n", log, filepath.Join(dir, "doc.json"), status)
	if err := os.WriteFile(filepath.Join(dir, "dcgmi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return log
}

func gpuDiagCmd(id string, level uint32) *sessionv1.Command {
	return &sessionv1.Command{Id: id, Kind: sessionv1.KindGPUDiag,
		Spec: &sessionv1.Command_GpuDiag{GpuDiag: &sessionv1.GPUDiagSpec{Level: level, GpuUuid: gpuA}}}
}

const dcgmFailDoc = `{"DCGM GPU Diagnostic": {"test_categories": [
 {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
 {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [
   {"gpu_ids": "0", "status": "Pass"},
   {"gpu_ids": "1", "status": "Fail", "warnings": [{"warning": "Memory error found at address 0x1000", "error_id": 5}]}]}]}]}}`

func TestGPUDiag(t *testing.T) {
	gpus := &fakeGPUs{check: gpudiag.Result{Tool: gpudiag.ToolNVML, Tests: 24}}
	e := executor.New(executor.Config{Commands: asSelf{}, GPUs: gpus, IsRoot: func() bool { return true }})
	run := func(c *sessionv1.Command) *sessionv1.CommandResult {
		t.Helper()
		r := newRecorder()
		e.HandleCommand(t.Context(), c, r.send)
		return wait(t, r)
	}
	detail := func(res *sessionv1.CommandResult) gpudiag.Result {
		t.Helper()
		var d gpudiag.Result
		if err := json.Unmarshal(res.DetailJson, &d); err != nil {
			t.Fatalf("detail %q: %v", res.DetailJson, err)
		}
		return d
	}

	// No dcgmi anywhere: level 1 runs the built-in NVML check.
	t.Setenv("PATH", t.TempDir())
	res := run(gpuDiagCmd("diag_1", 1))
	if res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || gpus.checks != 1 || detail(res).Tool != gpudiag.ToolNVML {
		t.Fatalf("without dcgmi: %v, checks %d", res, gpus.checks)
	}
	// The built-in check failing fails the command with what failed.
	gpus.check = gpudiag.Result{Tool: gpudiag.ToolNVML, Tests: 24, Failures: []gpudiag.Failure{{Test: "recovery-action", GPU: gpuA,
		Message: "the driver asks for recovery action GPU_RESET"}}}
	res = run(gpuDiagCmd("diag_2", 0))
	if res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.Error, "recovery-action on GPU "+gpuA) ||
		len(detail(res).Failures) != 1 {
		t.Fatalf("failing NVML check: %v", res)
	}

	// dcgmi present: it runs with the level, and its failed test names the command's error.
	args := standInDCGMI(t, dcgmFailDoc, 226)
	res = run(gpuDiagCmd("diag_3", 2))
	b, _ := os.ReadFile(args)
	if string(b) != "diag -r 2 -j\n" || res.State != sessionv1.CommandState_COMMAND_STATE_FAILED ||
		!strings.Contains(res.Error, "dcgmi diag -r 2 failed Hardware/GPU Memory on GPU 1: Memory error found at address 0x1000") ||
		gpus.checks != 2 {
		t.Fatalf("failing dcgmi: args %q, %v, checks %d", b, res, gpus.checks)
	}
	if d := detail(res); d.Tool != gpudiag.ToolDCGM || d.Level != 2 || d.Tests != 3 || len(d.Failures) != 1 {
		t.Fatalf("failing dcgmi's detail: %+v", d)
	}
	// A passing run succeeds; level 0 never runs dcgmi.
	standInDCGMI(t, strings.ReplaceAll(dcgmFailDoc, "Fail", "Pass"), 0)
	if res = run(gpuDiagCmd("diag_4", 1)); res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || detail(res).Tool != gpudiag.ToolDCGM {
		t.Fatalf("passing dcgmi: %v", res)
	}
	gpus.check = gpudiag.Result{Tool: gpudiag.ToolNVML, Tests: 24}
	if res = run(gpuDiagCmd("diag_5", 0)); res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || detail(res).Tool != gpudiag.ToolNVML {
		t.Fatalf("level 0 with dcgmi present: %v", res)
	}
	// dcgmi printing no JSON fails the command, saying so.
	standInDCGMI(t, "Error: unable to connect to host engine", 255)
	if res = run(gpuDiagCmd("diag_6", 1)); res.State != sessionv1.CommandState_COMMAND_STATE_FAILED ||
		!strings.Contains(res.Error, "exited with status 255") || !strings.Contains(res.Error, "no DCGM diagnostic JSON") {
		t.Fatalf("dcgmi without JSON: %v", res)
	}
	// A bad spec is refused before anything runs.
	bad := gpuDiagCmd("diag_7", 1)
	bad.GetGpuDiag().GpuUuid = "-h"
	if res = run(bad); res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.Error, "not a GPU UUID") {
		t.Fatalf("bad uuid: %v", res)
	}
}
