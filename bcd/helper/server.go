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
	"time"

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/process"
)

// Config configures the helper server.
type Config struct {
	// Socket is the Unix socket path. Defaults to DefaultSocket.
	Socket string
	// NodeUID is the only uid allowed to connect (the bcd user). Required.
	NodeUID uint32
	// NodeGID owns the socket (mode 0660), so the node user can reach it.
	NodeGID uint32
	// CommandUser is the user the node's commands and plain shells run as
	// (package bcd/cmduser); connections from it are refused. It must be
	// neither root nor the node user. When its Name is empty, execs and
	// shells that are not root are refused.
	CommandUser cmduser.User
	// CommandHome is the command user's HOME (cmduser.Home of the node's
	// data directory), made when missing. Required with CommandUser.
	CommandHome string
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
	cfg    Config
	log    *slog.Logger
	grants *grants
}

// NewServer returns a Server; call Run.
func NewServer(cfg Config, log *slog.Logger) *Server {
	cfg.Socket = cmp.Or(cfg.Socket, DefaultSocket)
	if len(cfg.RebootCommand) == 0 {
		cfg.RebootCommand = []string{"systemctl", "reboot"}
	}
	return &Server{cfg: cfg, log: log, grants: newGrants(time.Now)}
}

// Run listens until ctx ends. It fails at once when CommandUser is root or
// the node user, or has no CommandHome.
func (s *Server) Run(ctx context.Context) error {
	if cu := s.cfg.CommandUser; cu.Name != "" {
		if err := cu.Check(s.cfg.NodeUID); err != nil {
			return fmt.Errorf("helper: %w", err)
		}
		if s.cfg.CommandHome == "" {
			return errors.New("helper: the command user needs a home (CommandHome)")
		}
	}
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
	if cu := s.cfg.CommandUser; cu.Name != "" && uid == cu.UID {
		s.log.WarnContext(ctx, "Helper refused a connection from the command user", attrUID, uid, logkey.CommandUser, cu.Name)
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: fmt.Sprintf("uid %d may not use the root helper: it is the command user %s", uid, cu.Name)})
		return
	}
	if uid != s.cfg.NodeUID {
		s.log.WarnContext(ctx, "Helper refused a connection from another user", attrUID, uid, "want_uid", s.cfg.NodeUID)
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: fmt.Sprintf("uid %d may not use the root helper", uid)})
		return
	}
	r := bufio.NewReaderSize(c, 64<<10)
	line, err := readLine(r, MaxRequest)
	if err != nil {
		if errors.Is(err, errTooLong) {
			_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: err.Error()})
		}
		return
	}
	req, err := decodeRequest(line)
	if err != nil {
		s.log.WarnContext(ctx, "Helper refused a request", "op", req.Op, logkey.Err, err)
		_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: err.Error()})
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
	case OpGrant:
		tok, err := s.grants.issue(req.Grant.ID)
		if err != nil {
			_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: err.Error()})
			return
		}
		_ = enc.Encode(Frame{Done: true, Grant: tok})
	case OpExec:
		s.exec(octx, enc, req.Exec, true)
	case OpExecUser:
		s.exec(octx, enc, req.Exec, false)
	case OpUpgrade:
		s.upgrade(octx, enc, req.Upgrade)
	case OpPinsApply:
		s.pinsApply(octx, enc, req.Pins)
	case OpBMC:
		s.bmc(octx, enc, req.BMC)
	case OpKmsgXid:
		s.kmsgXid(octx, enc)
	case OpShell:
		s.shell(octx, c, enc, req.Shell, true)
	case OpShellUser:
		s.shell(octx, c, enc, req.Shell, false)
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

// exec runs spec as root (under its grant) or as the command user.
func (s *Server) exec(ctx context.Context, enc *json.Encoder, spec *ExecSpec, root bool) {
	var mu sync.Mutex
	out := func(stream int, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(Frame{Stream: stream, Data: data})
	}
	run := process.Spec{Argv: spec.Argv, Env: spec.Env, Dir: spec.Dir, OutputLimit: spec.OutputLimit}
	var res process.Result
	if root {
		if err := s.grants.use(spec.CommandID, spec.Grant); err != nil {
			s.log.WarnContext(ctx, "Helper refused a root exec", logkey.CommandID, spec.CommandID, logkey.Err, err)
			_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: "refused: " + err.Error()})
			return
		}
		s.log.InfoContext(ctx, "Running as root for the node", "program", spec.Argv[0], logkey.CommandID, spec.CommandID)
		run.Home, run.User = "/root", "root"
		res = process.Run(ctx, run, out)
	} else {
		cu := s.cfg.CommandUser
		if cu.Name == "" {
			_ = enc.Encode(Frame{Done: true, ExitCode: -1, Error: "this helper has no command user (--command-user): it runs only root commands"})
			return
		}
		s.log.DebugContext(ctx, "Running as the command user for the node", "program", spec.Argv[0], logkey.CommandID, spec.CommandID, logkey.CommandUser, cu.Name)
		res = (&cmduser.Runner{User: cu, Home: s.cfg.CommandHome}).Exec(ctx, run, out)
	}
	f := Frame{Done: true, ExitCode: res.ExitCode, Truncated: res.Truncated, Cancelled: res.Cancelled}
	if res.Err != nil {
		f.Error = res.Err.Error()
	}
	_ = enc.Encode(f)
}

// Log attribute keys of this package.
const (
	attrUID = "uid"
)

// readLine reads one line of at most max bytes (without its newline); a
// longer one fails with errTooLong.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			return nil, errTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}
