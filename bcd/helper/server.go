package helper

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	bcexec "github.com/better-compute/better-compute/bcd/exec"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
)

// Config configures the helper server.
type Config struct {
	// Socket is the Unix socket path. Defaults to DefaultSocket.
	Socket string
	// NodeUID is the only uid allowed to connect (the bcd user). Required.
	NodeUID uint32
	// NodeGID owns the socket (mode 0660), so the node user can reach it.
	NodeGID uint32
	// RebootCommand reboots the machine. Defaults to systemctl reboot.
	RebootCommand []string
	// Binary is the bcd binary OpUpgrade replaces. Defaults to the
	// executable this process started from (the node runs the same one).
	Binary string
	// PinsFile holds the release key pins OpUpgrade verifies against.
	// Defaults to upgrade.DefaultPinsFile (/etc/bcd/release-pins).
	PinsFile string
	// BMC carries out OpBMC (a *bmc.Controller). When nil, OpBMC is
	// refused.
	BMC BMCRunner
	// KernelLog is the kernel log device OpKmsgXid reads. Defaults to
	// kmsg.DefaultPath (/dev/kmsg).
	KernelLog string
}

// Server is the root helper.
type Server struct {
	cfg Config
	log *slog.Logger
}

// NewServer returns a Server; call Run.
func NewServer(cfg Config, log *slog.Logger) *Server {
	cfg.Socket = cmp.Or(cfg.Socket, DefaultSocket)
	if len(cfg.RebootCommand) == 0 {
		cfg.RebootCommand = []string{"systemctl", "reboot"}
	}
	return &Server{cfg: cfg, log: log}
}

// Run listens until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(s.cfg.Socket), 0o755); err != nil {
		return fmt.Errorf("helper socket dir: %w", err)
	}
	_ = os.Remove(s.cfg.Socket)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.cfg.Socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("helper listen: %w", err)
	}
	defer os.Remove(s.cfg.Socket)
	if err := os.Chown(s.cfg.Socket, 0, int(s.cfg.NodeGID)); err != nil {
		ln.Close()
		return fmt.Errorf("helper socket owner: %w", err)
	}
	if err := os.Chmod(s.cfg.Socket, 0o660); err != nil {
		ln.Close()
		return fmt.Errorf("helper socket mode: %w", err)
	}
	s.log.InfoContext(ctx, "Root helper listening", "socket", s.cfg.Socket, "node_uid", s.cfg.NodeUID)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("helper accept: %w", err)
		}
		wg.Go(func() { s.serve(ctx, c) })
	}
}

func (s *Server) serve(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var uid uint32
	var uerr error
	if err := raw.Control(func(fd uintptr) { uid, uerr = peerUID(fd) }); err != nil || uerr != nil {
		s.log.WarnContext(ctx, "Helper could not read peer credentials", logkey.Err, errors.Join(err, uerr))
		return
	}
	enc := json.NewEncoder(c)
	if uid != s.cfg.NodeUID {
		s.log.WarnContext(ctx, "Helper refused a connection from another user", "uid", uid, "want_uid", s.cfg.NodeUID)
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: fmt.Sprintf("uid %d may not use the root helper", uid)})
		return
	}
	r := bufio.NewReader(c)
	line, err := r.ReadBytes('\n')
	if err != nil {
		return
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: "malformed request"})
		return
	}
	// The client closing its side cancels the operation.
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = r.ReadByte()
		cancel()
	}()
	switch req.Op {
	case OpPing:
		_ = enc.Encode(Frame{Done: true})
	case OpExec:
		s.exec(octx, enc, req.Exec)
	case OpUpgrade:
		s.upgrade(octx, enc, req.Upgrade)
	case OpBMC:
		s.bmc(octx, enc, req.BMC)
	case OpKmsgXid:
		s.kmsgXid(octx, enc)
	case OpShell:
		s.shell(octx, c, enc, req.Shell)
	case OpReboot:
		s.log.WarnContext(ctx, "Rebooting at the node's request")
		out, err := exec.CommandContext(octx, s.cfg.RebootCommand[0], s.cfg.RebootCommand[1:]...).CombinedOutput()
		f := Frame{Done: true}
		if err != nil {
			f.ExitCode, f.Error = -1, fmt.Sprintf("reboot: %v: %s", err, out)
		}
		_ = enc.Encode(f)
	default:
		s.log.WarnContext(ctx, "Helper refused an operation off its allow-list", "op", req.Op)
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: fmt.Sprintf("operation %q is not on the root helper's allow-list", req.Op)})
	}
}

func (s *Server) exec(ctx context.Context, enc *json.Encoder, spec *ExecSpec) {
	if spec == nil || len(spec.Argv) == 0 {
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: "exec needs argv"})
		return
	}
	s.log.InfoContext(ctx, "Running as root for the node", "program", spec.Argv[0])
	var mu sync.Mutex
	res := bcexec.Run(ctx, bcexec.Spec{Argv: spec.Argv, Env: spec.Env, Dir: spec.Dir, OutputLimit: spec.OutputLimit, Home: "/root"},
		func(stream int, data []byte) {
			mu.Lock()
			defer mu.Unlock()
			_ = enc.Encode(Frame{Stream: stream, Data: data})
		})
	f := Frame{Done: true, ExitCode: res.ExitCode, Truncated: res.Truncated, Cancelled: res.Cancelled}
	if res.Err != nil {
		f.Error = res.Err.Error()
	}
	_ = enc.Encode(f)
}
