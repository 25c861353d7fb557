// Package tunnel is bcd's end of tunnels (docs/tunnels.md; session.proto,
// TunnelOpen): kind "shell" runs a login shell on a PTY (github.com/creack/pty)
// with the client's window size, passes its resizes and signals, and ends with
// the shell's exit status; kind "port" connects to 127.0.0.1:port on the
// node and copies bytes both ways, with half-closes. It satisfies
// session.TunnelHandler.
package tunnel

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/process"
	"github.com/better-compute/better-compute/bcd/session"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// maxData is the most bytes bcd puts in one data frame (the limit every
// hop enforces is 64 KiB).
const maxData = 32 << 10

// Config configures a Handler. Zero fields take the documented defaults.
type Config struct {
	// Shell is the shell kind "shell" runs. Defaults to $SHELL, else
	// /bin/bash when it exists, else /bin/sh.
	Shell string
	// Unprivileged reports that bcd runs as a plain user beside the root
	// helper: every shell is then started by the helper (Helper, its
	// "shell" operation), as root or as the command user.
	Unprivileged bool
	// Helper starts the shells when Unprivileged (a *helper.Client).
	Helper Shells
	// CommandUser is the user a shell without as_root runs as when bcd is
	// root (not Unprivileged). When nil such shells are refused.
	CommandUser *cmduser.User
	// CommandHome is CommandUser's HOME, its shells' working directory.
	CommandHome string
	// DialTimeout bounds kind "port"'s connect. Defaults to 5 s.
	DialTimeout time.Duration
	// Logger receives the handler's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// Handler opens tunnels.
type Handler struct {
	cfg Config
	log *slog.Logger
}

// New returns a Handler.
func New(cfg Config) *Handler {
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, 5*time.Second)
	if cfg.Shell == "" {
		cfg.Shell = os.Getenv("SHELL")
	}
	if cfg.Shell == "" {
		cfg.Shell = "/bin/sh"
		if _, err := os.Stat("/bin/bash"); err == nil {
			cfg.Shell = "/bin/bash"
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{cfg: cfg, log: log}
}

// HandleTunnel runs one tunnel (session.TunnelHandler).
func (h *Handler) HandleTunnel(ctx context.Context, open *sessionv1.TunnelOpen, st session.TunnelStream) {
	var err error
	switch open.GetKind() {
	case sessionv1.TunnelKindShell:
		err = h.shell(ctx, open, st)
	case sessionv1.TunnelKindPort:
		err = h.port(ctx, open, st)
	default:
		err = fmt.Errorf("unknown tunnel kind %q", open.GetKind())
	}
	if err != nil {
		h.log.WarnContext(ctx, "Tunnel failed", "tunnel_id", open.GetTunnelId(), logkey.Err, err)
		_ = st.Send(errorFrame(err.Error()))
	}
}

func errorFrame(msg string) *sessionv1.TunnelFrame {
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Error{Error: msg}}
}

func dataFrame(b []byte) *sessionv1.TunnelFrame {
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Data{Data: b}}
}

// signals maps the names session.proto allows to signals.
var signals = map[string]syscall.Signal{"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "HUP": syscall.SIGHUP,
	"QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL, "WINCH": syscall.SIGWINCH, "TSTP": syscall.SIGTSTP, "CONT": syscall.SIGCONT}

// signalName is the session.proto name of sig, or its number.
func signalName(sig syscall.Signal) string {
	for n, s := range signals {
		if s == sig {
			return n
		}
	}
	return strconv.Itoa(int(sig))
}

// shellProc is a shell on a PTY, started here or by the root helper.
type shellProc struct {
	ptmx   *os.File
	signal func(sig syscall.Signal)
	hangup func()
	kill   func()
	wait   func() (code int32, signal string, err error)
}

// startLocal starts the login shell in this process's stead: as root when
// asRoot (bcd is root), else as the command user.
func (h *Handler) startLocal(open *sessionv1.TunnelOpen, size *pty.Winsize, asRoot bool) (*shellProc, error) {
	cmd := exec.Command(h.cfg.Shell, "-l")
	term := open.GetTerm()
	if term == "" || len(term) > 64 {
		term = "xterm-256color"
	}
	name, home := "root", "/root"
	if !asRoot {
		u := h.cfg.CommandUser
		if u == nil {
			return nil, errors.New("this bcd has no command user to start shells as (bcd node --command-user)")
		}
		if err := cmduser.MakeHome(h.cfg.CommandHome, *u); err != nil {
			return nil, err
		}
		name, home = u.Name, h.cfg.CommandHome
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}}
	}
	cmd.Env = []string{"TERM=" + term, "HOME=" + home, "USER=" + name, "LOGNAME=" + name, "SHELL=" + h.cfg.Shell,
		"LANG=C.UTF-8", "PATH=" + process.DefaultPath}
	cmd.Dir = home
	if _, err := os.Stat(home); err != nil {
		cmd.Dir = "/"
	}
	ptmx, err := pty.StartWithSize(cmd, size)
	if err != nil {
		return nil, fmt.Errorf("start %s on a PTY: %w", h.cfg.Shell, err)
	}
	pid := cmd.Process.Pid
	return &shellProc{
		ptmx: ptmx,
		signal: func(sig syscall.Signal) {
			// The terminal's foreground process group, else the shell's.
			pgrp, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPGRP)
			if err != nil || pgrp <= 0 {
				pgrp = pid
			}
			_ = syscall.Kill(-pgrp, sig)
		},
		hangup: func() { _ = syscall.Kill(-pid, syscall.SIGHUP) },
		kill:   func() { _ = syscall.Kill(-pid, syscall.SIGKILL) },
		wait: func() (int32, string, error) {
			werr := cmd.Wait()
			var ee *exec.ExitError
			if errors.As(werr, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return -1, signalName(ws.Signal()), nil
				}
				return int32(ee.ExitCode()), "", nil
			}
			if werr != nil {
				return -1, "", fmt.Errorf("wait for the shell: %w", werr)
			}
			return 0, "", nil
		},
	}, nil
}

// controlChars are the signals a shell of the helper gets through its
// terminal (an unprivileged bcd cannot signal root's or the command user's
// processes): the line discipline sends them to the foreground process
// group.
var controlChars = map[syscall.Signal]byte{syscall.SIGINT: 3, syscall.SIGQUIT: 0x1c, syscall.SIGTSTP: 0x1a}

// startHelper asks the root helper for a shell (bcd unprivileged): a root
// shell under a grant bound to the tunnel's id, or the command user's.
func (h *Handler) startHelper(ctx context.Context, open *sessionv1.TunnelOpen, size *pty.Winsize) (*shellProc, error) {
	rs, err := h.cfg.Helper.Shell(ctx, helper.ShellSpec{Rows: size.Rows, Cols: size.Cols, Term: open.GetTerm(),
		AsRoot: open.GetAsRoot(), ID: open.GetTunnelId()})
	if err != nil {
		return nil, fmt.Errorf("shell through the root helper: %w", err)
	}
	return &shellProc{
		ptmx: rs.PTY,
		signal: func(sig syscall.Signal) {
			if c, ok := controlChars[sig]; ok {
				_, _ = rs.PTY.Write([]byte{c})
			} else if sig == syscall.SIGHUP || sig == syscall.SIGKILL || sig == syscall.SIGTERM {
				rs.Close()
			}
		},
		hangup: rs.Close,
		kill:   rs.Close,
		wait: func() (int32, string, error) {
			code, sig, err := rs.Wait()
			if n, perr := strconv.Atoi(sig); perr == nil && sig != "" {
				sig = signalName(syscall.Signal(n))
			}
			return int32(code), sig, err
		},
	}, nil
}

// Shells starts shells, as root or as the command user: the root helper's
// client (*helper.Client) when bcd runs unprivileged.
type Shells interface {
	Shell(ctx context.Context, spec helper.ShellSpec) (*helper.RootShell, error)
}

// shell runs a login shell on a PTY until it exits or the tunnel ends: as
// the command user, or as root for as_root; through the root helper when
// bcd runs unprivileged, started by bcd itself when it is root.
func (h *Handler) shell(ctx context.Context, open *sessionv1.TunnelOpen, st session.TunnelStream) error {
	size := &pty.Winsize{Rows: uint16(cmp.Or(open.GetRows(), 24)), Cols: uint16(cmp.Or(open.GetCols(), 80))}
	var p *shellProc
	var err error
	switch {
	case h.cfg.Unprivileged:
		if h.cfg.Helper == nil {
			return errors.New("a shell of an unprivileged bcd needs the root helper, which this bcd was not given")
		}
		p, err = h.startHelper(ctx, open, size)
	case os.Geteuid() != 0:
		return errors.New("a shell needs bcd running as root (it starts shells as the command user) or with the root helper (--unprivileged)")
	default:
		p, err = h.startLocal(open, size, open.GetAsRoot())
	}
	if err != nil {
		return err
	}
	ptmx := p.ptmx
	defer ptmx.Close()

	exited := make(chan struct{}) // closed when the shell exited
	// Client to shell: keystrokes, resizes, signals.
	go func() {
		for {
			f, err := st.Recv()
			if err != nil {
				// The tunnel ended: hang up the shell.
				p.hangup()
				return
			}
			switch b := f.GetBody().(type) {
			case *sessionv1.TunnelFrame_Data:
				if _, err := ptmx.Write(b.Data); err != nil {
					return
				}
			case *sessionv1.TunnelFrame_Resize:
				_ = pty.Setsize(ptmx, &pty.Winsize{Rows: uint16(b.Resize.GetRows()), Cols: uint16(b.Resize.GetCols())})
			case *sessionv1.TunnelFrame_Signal:
				if sig, ok := signals[b.Signal]; ok {
					p.signal(sig)
				}
			case *sessionv1.TunnelFrame_Eof:
				// The client's input ended: end of input for the shell,
				// ^D, repeated a few times, since a shell starting up
				// may flush input typed before it reads.
				go func() {
					for range 20 {
						if _, err := ptmx.Write([]byte{4}); err != nil {
							return
						}
						select {
						case <-exited:
							return
						case <-time.After(250 * time.Millisecond):
						}
					}
				}()
			}
		}
	}()
	// Shell to client.
	out := make(chan struct{})
	go func() {
		defer close(out)
		buf := make([]byte, maxData)
		for {
			n, err := ptmx.Read(buf)
			if n > 0 {
				if st.Send(dataFrame(append([]byte(nil), buf[:n]...))) != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	type status struct {
		code int32
		sig  string
		err  error
	}
	waited := make(chan status, 1)
	go func() {
		code, sig, err := p.wait()
		waited <- status{code, sig, err}
	}()
	var ws status
	select {
	case ws = <-waited:
	case <-ctx.Done():
		p.kill()
		ws = <-waited
	}
	close(exited)
	// The output the shell wrote before it exited; a background process
	// holding the terminal open does not keep the tunnel.
	select {
	case <-out:
	case <-time.After(time.Second):
	}
	if ws.err != nil {
		return ws.err
	}
	return st.Send(&sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Exit{Exit: &sessionv1.TunnelExit{ExitCode: ws.code, Signal: ws.sig}}})
}

// port connects to 127.0.0.1:port and copies bytes both ways; a half close
// of either side is passed on, and the tunnel ends when both sides closed.
func (h *Handler) port(ctx context.Context, open *sessionv1.TunnelOpen, st session.TunnelStream) error {
	p := open.GetPort()
	if p == 0 || p > 65535 {
		return fmt.Errorf("port %d: want 1 to 65535", p)
	}
	d := net.Dialer{Timeout: h.cfg.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(p))))
	if err != nil {
		return fmt.Errorf("connect to port %d on the node: %w", p, err)
	}
	tcp := conn.(*net.TCPConn)
	defer tcp.Close()
	stop := context.AfterFunc(ctx, func() { tcp.Close() })
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { // client to port
		for {
			f, err := st.Recv()
			if err != nil {
				tcp.Close()
				return
			}
			switch b := f.GetBody().(type) {
			case *sessionv1.TunnelFrame_Data:
				if _, err := tcp.Write(b.Data); err != nil {
					return
				}
			case *sessionv1.TunnelFrame_Eof:
				_ = tcp.CloseWrite()
				return
			}
		}
	})
	wg.Go(func() { // port to client
		buf := make([]byte, maxData)
		for {
			n, err := tcp.Read(buf)
			if n > 0 {
				if st.Send(dataFrame(append([]byte(nil), buf[:n]...))) != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					_ = st.Send(&sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Eof{Eof: true}})
				}
				return
			}
		}
	})
	wg.Wait()
	return st.Send(&sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Exit{Exit: &sessionv1.TunnelExit{}}})
}
