package upgrade

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// TrialEnv, set in a bcd node's environment, starts it in trial mode: it
// connects once and, on the first Welcome, calls ReportTrial and exits 0.
const TrialEnv = "BCD_UPGRADE_TRIAL"

// trialFD is the file descriptor a trial reports on.
const trialFD = 3

// trialExitGrace is how long a trial that reported may take to exit.
const trialExitGrace = 15 * time.Second

// InTrial reports whether this process runs as an upgrade's trial.
func InTrial() bool { return os.Getenv(TrialEnv) != "" }

// ReportTrial tells the bcd that started this trial that it reached a
// gateway, running version.
func ReportTrial(version string) error {
	f := os.NewFile(trialFD, "upgrade-trial")
	if f == nil {
		return errors.New("report upgrade trial: no file descriptor 3")
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "ok %s\n", version); err != nil {
		return fmt.Errorf("report upgrade trial: %w", err)
	}
	return nil
}

// trial runs the installed binary in trial mode and waits, at most
// HealthTimeout, for it to report that it reached a gateway as version.
func (u *Upgrader) trial(ctx context.Context, version string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("start the new bcd: %w", err)
	}
	defer r.Close()
	newCmd := func() *exec.Cmd {
		cmd := exec.Command(u.cfg.Target, u.cfg.Args[1:]...)
		cmd.Env = append(withoutTrial(u.cfg.Env), TrialEnv+"=1")
		cmd.Stdout, cmd.Stderr = u.cfg.Stdout, u.cfg.Stderr
		cmd.ExtraFiles = []*os.File{w} // fd 3
		// The trial dies with this process, so it cannot outlive a bcd
		// killed while it waits.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd
	}
	// Pdeathsig follows the thread that forks, so that thread is kept until
	// the trial is over.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd, err := startRetryingBusy(ctx, newCmd)
	w.Close()
	if err != nil {
		return fmt.Errorf("start the new bcd: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(io.LimitReader(r, 256)).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	kill := func() error {
		_ = cmd.Process.Kill()
		return <-exited
	}
	timer := time.NewTimer(u.cfg.HealthTimeout)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		kill()
		return ctx.Err()
	case <-timer.C:
		kill()
		return fmt.Errorf("it reached no gateway within %v", u.cfg.HealthTimeout)
	case line := <-lines:
		if line == "" {
			// The pipe closed without a report: the process is ending.
			select {
			case err := <-exited:
				return fmt.Errorf("it exited before reaching a gateway (%v)", exitDescription(err))
			case <-time.After(trialExitGrace):
				kill()
				return errors.New("it closed its report pipe without reaching a gateway")
			}
		}
		if line != "ok "+version {
			kill()
			return fmt.Errorf("it reported %q, not %q", line, "ok "+version)
		}
	}
	select {
	case <-exited:
	case <-time.After(trialExitGrace):
		kill()
	}
	return nil
}

// textBusyRetry bounds how long starting a freshly written binary is
// retried while exec fails with ETXTBSY.
const textBusyRetry = 2 * time.Second

// startRetryingBusy starts the command newCmd builds, building and starting
// it again while exec fails with ETXTBSY, for at most textBusyRetry. A binary
// just written is "busy" while any process forked during the write still
// holds its descriptor between fork and exec (the close-on-exec flag acts
// only at exec; golang.org/issue/22315): a plugin or helper started at the
// same moment is enough. The window is that child's fork-to-exec, so a few
// short retries end it.
func startRetryingBusy(ctx context.Context, newCmd func() *exec.Cmd) (*exec.Cmd, error) {
	deadline := time.Now().Add(textBusyRetry)
	for wait := 5 * time.Millisecond; ; wait *= 2 {
		cmd := newCmd()
		err := cmd.Start()
		if err == nil || !errors.Is(err, syscall.ETXTBSY) || time.Now().After(deadline) {
			return cmd, err
		}
		select {
		case <-ctx.Done():
			return cmd, err
		case <-time.After(min(wait, 200*time.Millisecond)):
		}
	}
}

// exitDescription says how a process ended.
func exitDescription(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ProcessState.String()
	}
	return err.Error()
}

// withoutTrial returns env without TrialEnv.
func withoutTrial(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, TrialEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}
