package helper

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/creack/pty"
)

// OpShell starts a root login shell on a new PTY for a tunnel
// (docs/tunnels.md, `nodes shell --as-root`) and hands the PTY's master to
// the client over the socket (SCM_RIGHTS) with a first Frame; the last
// Frame, once the shell exits, carries its exit status (ExitCode, and
// Signal when a signal ended it). The client closing the connection hangs
// up the shell's process group.
const OpShell = "shell"

// ShellSpec is the call of OpShell.
type ShellSpec struct {
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	Term string `json:"term,omitempty"`
}

// shell serves OpShell on c.
func (s *Server) shell(ctx context.Context, c *net.UnixConn, enc *json.Encoder, spec *ShellSpec) {
	if spec == nil {
		spec = &ShellSpec{}
	}
	sh := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		sh = "/bin/bash"
	}
	cmd := exec.Command(sh, "-l")
	term := spec.Term
	if term == "" || len(term) > 64 {
		term = "xterm-256color"
	}
	cmd.Env = []string{"TERM=" + term, "HOME=/root", "USER=root", "LOGNAME=root", "SHELL=" + sh,
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/root"
	if _, err := os.Stat(cmd.Dir); err != nil {
		cmd.Dir = "/"
	}
	rows, cols := spec.Rows, spec.Cols
	if rows == 0 || cols == 0 {
		rows, cols = 24, 80
	}
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: fmt.Sprintf("start a root shell: %v", err)})
		return
	}
	s.log.InfoContext(ctx, "Root shell started for the node", "pid", cmd.Process.Pid)
	ack, _ := json.Marshal(Frame{})
	_, _, err = c.WriteMsgUnix(append(ack, '\n'), syscall.UnixRights(int(ptmx.Fd())), nil)
	ptmx.Close() // the client holds it now
	if err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-waited:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGHUP)
		werr = <-waited
	}
	f := Frame{Done: true}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			f.ExitCode, f.Signal = -1, strconv.Itoa(int(ws.Signal()))
		} else {
			f.ExitCode = ee.ExitCode()
		}
	} else if werr != nil {
		f.ExitCode, f.Error = -1, werr.Error()
	}
	_ = enc.Encode(f)
}

// RootShell is a root shell the helper started: its PTY's master, and its
// end.
type RootShell struct {
	// PTY is the master side of the shell's terminal.
	PTY *os.File
	// Wait returns the shell's exit status once it ended (signal: the
	// signal's number, as text, when one ended it).
	Wait func() (code int, signal string, err error)
	// Close hangs the shell up (the connection to the helper closes).
	Close func()
}

// Shell asks the helper for a root shell on a new PTY (OpShell).
func (c *Client) Shell(ctx context.Context, spec ShellSpec) (*RootShell, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	uc := conn.(*net.UnixConn)
	if err := json.NewEncoder(uc).Encode(Request{Op: OpShell, Shell: &spec}); err != nil {
		uc.Close()
		return nil, fmt.Errorf("send to root helper: %w", err)
	}
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("root helper closed the connection: %w", err)
	}
	line, rest, _ := bytes.Cut(buf[:n], []byte{'\n'})
	var first Frame
	if err := json.Unmarshal(line, &first); err != nil {
		uc.Close()
		return nil, fmt.Errorf("root helper: malformed answer: %w", err)
	}
	if first.Done {
		uc.Close()
		return nil, fmt.Errorf("root helper: %s", first.Error)
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		uc.Close()
		return nil, errors.New("root helper sent no terminal")
	}
	fds, err := syscall.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		uc.Close()
		return nil, errors.New("root helper sent no terminal")
	}
	ptmx := os.NewFile(uintptr(fds[0]), "root-shell-pty")
	r := bufio.NewReader(uc)
	return &RootShell{
		PTY:   ptmx,
		Close: func() { uc.Close() },
		Wait: func() (int, string, error) {
			dec := json.NewDecoder(bytes.NewReader(rest))
			var f Frame
			if len(bytes.TrimSpace(rest)) == 0 || dec.Decode(&f) != nil {
				if err := json.NewDecoder(r).Decode(&f); err != nil {
					return -1, "", fmt.Errorf("root helper closed the connection: %w", err)
				}
			}
			if f.Error != "" {
				return f.ExitCode, f.Signal, errors.New(f.Error)
			}
			return f.ExitCode, f.Signal, nil
		},
	}, nil
}
