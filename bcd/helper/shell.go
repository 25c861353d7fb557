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

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/process"
)

// OpShell starts a login shell on a new PTY for a tunnel (docs/tunnels.md,
// `nodes shell`): as the command user, or as root (`--as-root`) under a
// grant (OpGrant) for the tunnel's id. It hands the PTY's master to the
// client over the socket (SCM_RIGHTS) with a first Frame; the last
// Frame, once the shell exits, carries its exit status (ExitCode, and
// Signal when a signal ended it). The client closing the connection hangs
// up the shell's process group.
const OpShell = "shell"

// OpShellUser starts a login shell as the command user, as OpShell does
// otherwise (an operation of its own, which a helper older than the
// command user refuses).
const OpShellUser = "shell.user"

// ShellSpec is the call of OpShell.
type ShellSpec struct {
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	Term string `json:"term,omitempty"`
	// AsRoot chooses the operation Client.Shell asks for: OpShell, a root
	// shell under Grant, or OpShellUser. It is not sent.
	AsRoot bool `json:"-"`
	// ID is the tunnel's id, which Grant must be bound to (OpShell).
	ID string `json:"id,omitempty"`
	// Grant is the token OpGrant returned for ID; Client.Shell asks for
	// one itself when it is empty.
	Grant string `json:"grant,omitempty"`
}

// shell serves OpShell (root) and OpShellUser on c.
func (s *Server) shell(ctx context.Context, c *net.UnixConn, enc *json.Encoder, spec *ShellSpec, root bool) {
	sh := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		sh = "/bin/bash"
	}
	cmd := exec.Command(sh, "-l")
	term := spec.Term
	if term == "" || len(term) > 64 {
		term = "xterm-256color"
	}
	name, home := "root", "/root"
	if root {
		if err := s.grants.use(spec.ID, spec.Grant); err != nil {
			s.log.WarnContext(ctx, "Helper refused a root shell", "tunnel_id", spec.ID, logkey.Err, err)
			_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: "refused: " + err.Error()})
			return
		}
	} else {
		cu := s.cfg.CommandUser
		if cu.Name == "" {
			_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: "this helper has no command user (--command-user): it starts only root shells"})
			return
		}
		if err := cmduser.MakeHome(s.cfg.CommandHome, cu); err != nil {
			_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: err.Error()})
			return
		}
		name, home = cu.Name, s.cfg.CommandHome
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: cu.UID, Gid: cu.GID, Groups: []uint32{}}}
	}
	cmd.Env = []string{"TERM=" + term, "HOME=" + home, "USER=" + name, "LOGNAME=" + name, "SHELL=" + sh,
		"LANG=C.UTF-8", "PATH=" + process.DefaultPath}
	cmd.Dir = home
	if _, err := os.Stat(cmd.Dir); err != nil {
		cmd.Dir = "/"
	}
	rows, cols := spec.Rows, spec.Cols
	if rows == 0 || cols == 0 {
		rows, cols = 24, 80
	}
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: fmt.Sprintf("start a shell as %s: %v", name, err)})
		return
	}
	s.log.InfoContext(ctx, "Shell started for the node", "pid", cmd.Process.Pid, "user", name, "tunnel_id", spec.ID)
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

// RootShell is a shell the helper started (as root or as the command
// user): its PTY's master, and its end.
type RootShell struct {
	// PTY is the master side of the shell's terminal.
	PTY *os.File
	// Wait returns the shell's exit status once it ended (signal: the
	// signal's number, as text, when one ended it).
	Wait func() (code int, signal string, err error)
	// Close hangs the shell up (the connection to the helper closes).
	Close func()
}

// Shell asks the helper for a shell on a new PTY (OpShell): as root when
// spec.AsRoot (it asks for the grant for spec.ID first, unless spec carries
// one), else as the command user.
func (c *Client) Shell(ctx context.Context, spec ShellSpec) (*RootShell, error) {
	if spec.AsRoot && spec.Grant == "" {
		g, err := c.Grant(ctx, spec.ID)
		if err != nil {
			return nil, err
		}
		spec.Grant = g
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	uc := conn.(*net.UnixConn)
	op := OpShellUser
	if spec.AsRoot {
		op = OpShell
	}
	if err := json.NewEncoder(uc).Encode(Request{Op: op, Shell: &spec}); err != nil {
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
