// Package process runs one program for a command: in its own process group, with
// a fixed environment, an output cap and a deadline. Cancelling kills the
// whole process group, so no child outlives its command.
package process

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"sort"
	"sync"
	"syscall"
)

// Streams of output chunks.
const (
	Stdout = 1
	Stderr = 2
)

// DefaultPath is the PATH a command gets unless its Env sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Spec describes one run.
type Spec struct {
	// Argv is the program and its arguments; Argv[0] is looked up in PATH.
	Argv []string
	// Env is added to a minimal environment (PATH, HOME, LANG=C.UTF-8,
	// and USER when User is set).
	Env map[string]string
	// Dir is the working directory. Defaults to / .
	Dir string
	// OutputLimit caps stdout and stderr together, in bytes; output past it
	// is read and dropped, and Result.Truncated is set. Defaults to 1 MiB.
	OutputLimit int64
	// Credential runs the program as another user (needs root).
	Credential *syscall.Credential
	// Home is the HOME of the user it runs as. Defaults to / .
	Home string
	// User is the name of the user it runs as (USER). Defaults to none.
	User string
	// Started, when set, is called with the program's pid, which is also
	// its process group id, once it has started and before its output is
	// read; the pid is not reaped before Started returns.
	Started func(pid int)
}

// Result is how a run ended.
type Result struct {
	// ExitCode is the exit status, or -1 when the program was killed by a
	// signal or did not start.
	ExitCode int
	// Truncated reports output dropped past OutputLimit.
	Truncated bool
	// Cancelled reports that ctx ended before the program did (the process
	// group was killed); ctx's error says whether by cancel or deadline.
	Cancelled bool
	// Err is why the program could not start, or a signal that ended it.
	Err error
}

// Run runs spec until it exits or ctx ends, delivering output chunks to out
// (never concurrently, in order per stream).
func Run(ctx context.Context, spec Spec, out func(stream int, data []byte)) Result {
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return Result{ExitCode: -1, Err: errors.New("empty argv")}
	}
	limit := cmp.Or(spec.OutputLimit, 1<<20)
	env := map[string]string{"PATH": DefaultPath, "HOME": cmp.Or(spec.Home, "/"), "LANG": "C.UTF-8"}
	if spec.User != "" {
		env["USER"] = spec.User
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	path, err := lookPath(spec.Argv[0], env["PATH"])
	if err != nil {
		return Result{ExitCode: -1, Err: err}
	}
	cmd := osexec.Command(path, spec.Argv[1:]...)
	cmd.Args[0] = spec.Argv[0]
	cmd.Dir = cmp.Or(spec.Dir, "/")
	cmd.Env = envList(env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: spec.Credential}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Result{ExitCode: -1, Err: err}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return Result{ExitCode: -1, Err: err}
	}
	if err := cmd.Start(); err != nil {
		return Result{ExitCode: -1, Err: fmt.Errorf("start %s: %w", spec.Argv[0], err)}
	}
	pgid := cmd.Process.Pid
	killGroup := func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
	if spec.Started != nil {
		spec.Started(pgid)
	}

	var mu sync.Mutex
	var written int64
	truncated := false
	deliver := func(stream int, b []byte) {
		mu.Lock()
		defer mu.Unlock()
		room := limit - written
		if room <= 0 {
			truncated = true
			return
		}
		if int64(len(b)) > room {
			b = b[:room]
			truncated = true
		}
		written += int64(len(b))
		out(stream, append([]byte(nil), b...))
	}
	var wg sync.WaitGroup
	for stream, r := range map[int]io.Reader{Stdout: stdout, Stderr: stderr} {
		wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					deliver(stream, buf[:n])
				}
				if err != nil {
					return
				}
			}
		})
	}
	// Kill the group when ctx ends; pipes held open by children are closed
	// by the kill too.
	stop := context.AfterFunc(ctx, killGroup)
	wg.Wait()
	werr := cmd.Wait()
	stop()
	killGroup() // children left in the background die with their command
	res := Result{ExitCode: cmd.ProcessState.ExitCode(), Truncated: truncated}
	if ctx.Err() != nil {
		res.Cancelled = true
		res.Err = ctx.Err()
		return res
	}
	var ee *osexec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.Err = fmt.Errorf("killed by signal %v", ws.Signal())
		}
	} else if werr != nil {
		res.Err = werr
	}
	return res
}

// lookPath finds name in the command's PATH, not bcd's own.
func lookPath(name, path string) (string, error) {
	if containsSlash(name) {
		return name, nil
	}
	for _, dir := range filepathList(path) {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in PATH %s", name, path)
}

func containsSlash(s string) bool {
	for i := range len(s) {
		if s[i] == '/' {
			return true
		}
	}
	return false
}

func filepathList(p string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(p); i++ {
		if i == len(p) || p[i] == ':' {
			if i > start {
				out = append(out, p[start:i])
			}
			start = i + 1
		}
	}
	return out
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
