package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/process"
	"github.com/better-compute/better-compute/proto/gpudiag"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// GPUs is what gpu.reset needs from the node's GPU collector
// (*gpu.Collector implements it).
type GPUs interface {
	// Processes returns the ids of the processes using the GPU uuid; an
	// error when it is not one of the node's GPUs or NVML fails.
	Processes(ctx context.Context, uuid string) ([]int, error)
	// ResetDone tells the collector the GPU was reset, so that the XIDs
	// and ECC events that held its health end.
	ResetDone(uuid string)
	// Check runs the built-in NVML check gpu.diag falls back on (see
	// gpu.Collector.Check); an error when it could not run.
	Check(ctx context.Context, uuid string) (gpudiag.Result, error)
}

// Rebooter reboots the machine (*helper.Client when bcd is unprivileged).
type Rebooter interface {
	// Reboot asks the machine to reboot and returns once it has been
	// asked (the reboot itself comes later).
	Reboot(ctx context.Context) error
}

// Defaults of the node kinds.
var (
	// DefaultNvidiaSMI is Config.NvidiaSMI's default: looked up in bcd's
	// PATH, else in the PATH of the root side (process.DefaultPath).
	DefaultNvidiaSMI = "nvidia-smi"
	// DefaultDCGMI is Config.DCGMI's default: NVIDIA DCGM's command line,
	// looked up as nvidia-smi is.
	DefaultDCGMI = "dcgmi"
	// DefaultRebootCommand is Config.RebootCommand's default.
	DefaultRebootCommand = []string{"systemctl", "reboot"}
)

// refusedWhileDraining are the kinds a draining node refuses: those that
// start work or change bcd. The remediation kinds (gpu.reset, reboot, the
// BMC kinds, inventory.refresh, drain) are still taken.
var refusedWhileDraining = []string{sessionv1.KindExec, sessionv1.KindUpgrade, sessionv1.KindRollback}

// unfinished is what a command's run returns to leave it without a result
// (a reboot under way: the record in the journal, answered after the
// reboot, is its result).
var unfinished = &sessionv1.CommandResult{}

// running sends the command's Running update.
func running(u *updater) {
	_ = u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{StartedAt: timestamppb.Now()}}})
}

// output returns an output callback that sends chunks on u, with offsets
// per stream.
func output(u *updater) func(stream int, data []byte) {
	var offsets [3]uint64
	return func(stream int, data []byte) {
		st := sessionv1.OutputStream_OUTPUT_STREAM_STDOUT
		if stream == process.Stderr {
			st = sessionv1.OutputStream_OUTPUT_STREAM_STDERR
		}
		off := offsets[stream]
		offsets[stream] += uint64(len(data))
		_ = u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Output{Output: &sessionv1.OutputChunk{Stream: st, Data: data, Offset: off}}})
	}
}

// asRoot runs argv as root: through the root helper when there is one,
// itself when bcd is root; errRootUnavailable otherwise.
func (e *Executor) asRoot(ctx context.Context, id string, argv []string, out func(int, []byte)) process.Result {
	return e.asRootLimit(ctx, id, argv, 64<<10, out)
}

// asRootLimit is asRoot with limit bytes of output (stdout and stderr
// together) instead of 64 KiB.
func (e *Executor) asRootLimit(ctx context.Context, id string, argv []string, limit int64, out func(int, []byte)) process.Result {
	s := process.Spec{Argv: argv, OutputLimit: limit, Home: "/root", User: "root"}
	switch {
	case e.cfg.Root != nil:
		return e.cfg.Root.ExecRoot(ctx, id, s, out)
	case e.cfg.IsRoot():
		return process.Run(ctx, s, out)
	}
	return process.Result{ExitCode: -1, Err: errRootUnavailable}
}

// lookRoot resolves a program name as gpu.reset's nvidia-smi is: bcd's own
// PATH first (where an operator's program, or a test's stand-in, is), then
// the root side's default PATH; "" when neither has it. A name with a slash
// is taken as it is when it exists.
func lookRoot(name string) string {
	if strings.Contains(name, "/") {
		if _, err := os.Stat(name); err == nil {
			return name
		}
		return ""
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range filepath.SplitList(process.DefaultPath) {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return filepath.Join(dir, name)
		}
	}
	return ""
}

// gpuDiag checks the node's GPUs before they return to service
// (docs/remediation.md, "Diagnostic before return"): "dcgmi diag -r LEVEL
// -j" as root when the spec asks for a DCGM level and dcgmi is installed,
// else the built-in NVML check (GPUs.Check). SUCCEEDED when every test
// passed; FAILED naming the failed tests otherwise, or when the diagnostic
// could not run. The detail holds the gpudiag.Result either way.
func (e *Executor) gpuDiag(ctx context.Context, cmd *sessionv1.Command, u *updater) *sessionv1.CommandResult {
	spec := cmd.GetGpuDiag()
	uuid, level := spec.GetGpuUuid(), int(spec.GetLevel())
	if uuid != "" && !gpuUUID(uuid) {
		return failed(fmt.Sprintf("gpu.diag: gpuDiag.gpuUuid %q is not a GPU UUID (GPU-...)", uuid))
	}
	if level > 3 {
		return failed(fmt.Sprintf("gpu.diag: gpuDiag.level %d is not a DCGM run level (0 to 3)", level))
	}
	running(u)
	var res gpudiag.Result
	dcgmi := ""
	if level > 0 {
		dcgmi = lookRoot(e.cfg.DCGMI)
	}
	if dcgmi != "" {
		e.log.Info("Running DCGM's diagnostic", logkey.CommandID, u.id, "program", dcgmi, "level", level)
		var stdout []byte
		send := output(u)
		out := func(stream int, data []byte) {
			if stream == process.Stdout && len(stdout) < gpudiag.MaxOutput {
				stdout = append(stdout, data[:min(len(data), gpudiag.MaxOutput-len(stdout))]...)
			}
			send(stream, data)
		}
		run := e.asRootLimit(ctx, cmd.GetId(), []string{dcgmi, "diag", "-r", strconv.Itoa(level), "-j"}, gpudiag.MaxOutput, out)
		switch {
		case run.Cancelled || ctx.Err() != nil:
			return stopped(ctx, "gpu.diag: stopped while dcgmi diag ran")
		case run.Err != nil:
			return failed("gpu.diag: " + run.Err.Error())
		}
		r, err := gpudiag.ParseDCGM(stdout, level)
		if err != nil {
			return failed(fmt.Sprintf("gpu.diag: dcgmi diag -r %d exited with status %d: %v", level, run.ExitCode, err))
		}
		res = r
	} else {
		if e.cfg.GPUs == nil {
			return failed("gpu.diag: this node reads no GPUs through NVML")
		}
		if level > 0 {
			e.log.Info("No dcgmi on this node: running the built-in NVML check instead", logkey.CommandID, u.id, "level", level)
		}
		r, err := e.cfg.GPUs.Check(ctx, uuid)
		if err != nil {
			if ctx.Err() != nil {
				return stopped(ctx, "gpu.diag: stopped while the NVML check ran")
			}
			return failed("gpu.diag: the NVML check could not run: " + err.Error())
		}
		res = r
	}
	detail, _ := json.Marshal(res)
	if !res.Passed() {
		r := failed(fmt.Sprintf("gpu.diag: %s %s", res.Name(), res.Summary()))
		r.DetailJson = detail
		return r
	}
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, DetailJson: detail}
}

// stopped is the result of a command stopped by ctx: EXPIRED at its
// deadline, CANCELLED otherwise.
func stopped(ctx context.Context, msg string) *sessionv1.CommandResult {
	r := failed(msg)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.State = sessionv1.CommandState_COMMAND_STATE_EXPIRED
	} else {
		r.State = sessionv1.CommandState_COMMAND_STATE_CANCELLED
	}
	return r
}

// gpuUUID reports whether s looks like an NVML GPU UUID ("GPU-" and hex
// digits and dashes), so that it can never read as an option of nvidia-smi.
func gpuUUID(s string) bool {
	rest, ok := strings.CutPrefix(s, "GPU-")
	if !ok || rest == "" || len(s) > 64 {
		return false
	}
	for _, r := range rest {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') && (r < 'A' || r > 'F') && r != '-' {
			return false
		}
	}
	return true
}

// gpuReset resets one GPU with "nvidia-smi -r -i UUID", as root. A GPU in
// use is refused unless the spec says force; with force its processes are
// killed (SIGKILL, as root) first. On success the GPU collector is told
// (its XIDs and ECC events end) and the inventory is sent again.
func (e *Executor) gpuReset(ctx context.Context, cmd *sessionv1.Command, u *updater) *sessionv1.CommandResult {
	spec := cmd.GetGpuReset()
	uuid := spec.GetGpuUuid()
	if !gpuUUID(uuid) {
		return failed(fmt.Sprintf("gpu.reset: gpuReset.gpuUuid %q is not a GPU UUID (GPU-...)", uuid))
	}
	running(u)
	if e.cfg.GPUs == nil {
		return failed("gpu.reset: this node reads no GPUs through NVML")
	}
	pids, err := e.cfg.GPUs.Processes(ctx, uuid)
	if err != nil {
		return failed("gpu.reset: " + err.Error())
	}
	out := output(u)
	if len(pids) > 0 {
		if !spec.GetForce() {
			return failed(fmt.Sprintf("gpu.reset refused: GPU %s is in use by processes %v; send it with force to kill them and reset", uuid, pids))
		}
		argv := []string{"kill", "-KILL", "--"}
		for _, p := range pids {
			argv = append(argv, strconv.Itoa(p))
		}
		e.log.Warn("Killing the processes on a GPU before a forced reset", logkey.CommandID, u.id, "gpu_uuid", uuid, "pids", pids)
		if res := e.asRoot(ctx, cmd.GetId(), argv, out); res.Err != nil && ctx.Err() == nil {
			return failed("gpu.reset: kill the GPU's processes: " + res.Err.Error())
		}
	}
	smi := e.cfg.NvidiaSMI
	if !strings.Contains(smi, "/") {
		// bcd's own PATH first (where an operator's nvidia-smi, or a
		// test's stand-in, is); the root side's default PATH otherwise.
		if p, err := exec.LookPath(smi); err == nil {
			smi = p
		}
	}
	e.log.Info("Resetting a GPU", logkey.CommandID, u.id, "gpu_uuid", uuid, "program", smi)
	res := e.asRoot(ctx, cmd.GetId(), []string{smi, "-r", "-i", uuid}, out)
	switch {
	case res.Cancelled || ctx.Err() != nil:
		r := failed("gpu.reset: stopped while nvidia-smi ran")
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			r.State = sessionv1.CommandState_COMMAND_STATE_EXPIRED
		} else {
			r.State = sessionv1.CommandState_COMMAND_STATE_CANCELLED
		}
		return r
	case res.Err != nil:
		return failed("gpu.reset: " + res.Err.Error())
	case res.ExitCode != 0:
		r := failed(fmt.Sprintf("gpu.reset: nvidia-smi -r exited with status %d (see the output)", res.ExitCode))
		r.ExitCode = int32(res.ExitCode)
		return r
	}
	e.cfg.GPUs.ResetDone(uuid)
	if e.cfg.RefreshInventory != nil {
		if err := e.cfg.RefreshInventory(ctx); err != nil {
			e.log.Warn("Inventory not sent after a GPU reset", logkey.CommandID, u.id, logkey.Err, err)
		}
	}
	detail, _ := json.Marshal(map[string]any{"gpuUuid": uuid, "killedPids": pids})
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, DetailJson: detail}
}

// reboot asks the machine to reboot, then waits for it to go down. The
// command was recorded in the journal before it started; it is left
// without a result, and after the reboot recovery answers it SUCCEEDED
// from the journal (recover.go), so a redelivered reboot is never repeated.
// Without a journal it is refused: nothing would stop a second reboot.
func (e *Executor) reboot(ctx context.Context, u *updater) *sessionv1.CommandResult {
	if e.cfg.Journal == nil {
		return failed("reboot refused: bcd keeps no command journal (no data directory), so it could not tell a redelivered reboot after the reboot")
	}
	running(u)
	e.log.Warn("Rebooting the machine", logkey.CommandID, u.id)
	var err error
	switch {
	case e.cfg.Reboot != nil:
		err = e.cfg.Reboot.Reboot(ctx)
	case e.cfg.IsRoot():
		argv := slices.Clone(e.cfg.RebootCommand)
		if !strings.Contains(argv[0], "/") {
			// As nvidia-smi is: bcd's own PATH first (a test's
			// stand-in systemctl), the default PATH otherwise.
			if p, err := exec.LookPath(argv[0]); err == nil {
				argv[0] = p
			}
		}
		if res := process.Run(ctx, process.Spec{Argv: argv, OutputLimit: 4 << 10}, output(u)); res.Err != nil {
			err = res.Err
		} else if res.ExitCode != 0 {
			err = fmt.Errorf("%s exited with status %d", strings.Join(e.cfg.RebootCommand, " "), res.ExitCode)
		}
	default:
		err = errRootUnavailable
	}
	if err != nil {
		return failed("reboot: " + err.Error())
	}
	<-ctx.Done()
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		r := failed("reboot was asked for, but the machine was still up at the command's deadline")
		r.State = sessionv1.CommandState_COMMAND_STATE_EXPIRED
		return r
	case errors.Is(context.Cause(ctx), errCancelled):
		r := failed("cancelled after the reboot was asked for; it may still happen")
		r.State = sessionv1.CommandState_COMMAND_STATE_CANCELLED
		return r
	}
	return unfinished // bcd is stopping for the reboot
}

// draining reports whether a drain command is running.
func (e *Executor) draining() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.drains > 0
}

// drain waits for the running commands other than drains to end, while
// new exec, upgrade and rollback commands are refused, and succeeds once
// none is left (detail: the ids it waited for). At the command's deadline
// it ends EXPIRED naming the commands still running. Once it has ended the
// node takes every kind again: keeping new work away is the cordon's job
// in the control plane; the drain is the node's barrier.
func (e *Executor) drain(ctx context.Context, u *updater) *sessionv1.CommandResult {
	running(u)
	e.mu.Lock()
	e.drains++
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.drains--
		e.mu.Unlock()
	}()
	var waited []string
	for {
		e.mu.Lock()
		var busy []string
		for el := e.order.Front(); el != nil; el = el.Next() {
			if en := el.Value.(*entry); en.cancel != nil && en.kind != sessionv1.KindDrain {
				busy = append(busy, en.id)
			}
		}
		changed := e.changed
		e.mu.Unlock()
		for _, id := range busy {
			if !slices.Contains(waited, id) {
				waited = append(waited, id)
			}
		}
		if len(busy) == 0 {
			detail, _ := json.Marshal(map[string]any{"waitedFor": waited})
			return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, DetailJson: detail}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			r := failed(fmt.Sprintf("drain ended with %d commands still running: %s", len(busy), strings.Join(busy, ", ")))
			r.State = sessionv1.CommandState_COMMAND_STATE_CANCELLED
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				r.State = sessionv1.CommandState_COMMAND_STATE_EXPIRED
			}
			return r
		}
	}
}
