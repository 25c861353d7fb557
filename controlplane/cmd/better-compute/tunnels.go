package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/better-compute/better-compute/controlplane/internal/accept"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// remoteExitError carries the exit status of a remote shell: better-compute
// exits with it and prints nothing more.
type remoteExitError struct{ code int }

func (e remoteExitError) Error() string { return fmt.Sprintf("the remote shell exited %d", e.code) }

// nodesShellCmd is nodes shell NODE [--as-root] (docs/tunnels.md).
func nodesShellCmd(e *env, af *apiFlags) *cobra.Command {
	var asRoot bool
	cmd := &cobra.Command{
		Use:   "shell NODE [--as-root]",
		Short: "Open an interactive shell on a node (a PTY over the node's own session; audited)",
		Long: `shell opens a login shell on NODE with a terminal (tunnels.create, then
GET {basePath}/tunnels/{ticket} as a WebSocket) and exits with the shell's
exit status (128+N when a signal N ended it). The terminal is put in raw
mode while the shell runs; its size follows yours. --as-root needs an admin
token.`,
		// The terminal's bytes pass as they are (escape.go).
		Annotations: map[string]string{annotationRawOutput: "true"},
		Args:        cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client(af)
			if err != nil {
				return err
			}
			n, err := c.NodesGet(cmd.Context(), &apiv1.NodeRequest{Id: args[0]})
			if err != nil {
				return err
			}
			if err := refuseSimulated(n.GetNode()); err != nil {
				return err
			}
			return runShell(cmd.Context(), c, args[0], asRoot, os.Stdin, e.stdout)
		},
	}
	cmd.Flags().BoolVar(&asRoot, "as-root", false, "run the shell as root (admin token)")
	return cmd
}

// runShell runs the shell tunnel with in and out as the terminal.
func runShell(ctx context.Context, c *client.Client, node string, asRoot bool, in *os.File, out io.Writer) error {
	fd := int(in.Fd())
	isTerm := term.IsTerminal(fd)
	q := url.Values{}
	if isTerm {
		if cols, rows, err := term.GetSize(fd); err == nil {
			q.Set("rows", strconv.Itoa(rows))
			q.Set("cols", strconv.Itoa(cols))
		}
	}
	q.Set("term", os.Getenv("TERM"))
	t, err := c.OpenTunnel(ctx, &apiv1.CreateTunnelRequest{Node: node, Kind: tunnel.KindShell, AsRoot: asRoot}, q)
	if err != nil {
		return err
	}
	defer t.Close()
	if isTerm {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("raw terminal: %w", err)
		}
		defer term.Restore(fd, old)
	}
	var sendMu sync.Mutex
	send := func(f *sessionv1.TunnelFrame) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return t.Send(ctx, f)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGWINCH, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		for s := range sigs {
			switch s {
			case syscall.SIGWINCH:
				if cols, rows, err := term.GetSize(fd); err == nil {
					_ = send(tunnel.Resize(uint32(rows), uint32(cols)))
				}
			case syscall.SIGINT:
				_ = send(tunnel.Signal("INT"))
			case syscall.SIGTERM:
				_ = send(tunnel.Signal("TERM"))
			case syscall.SIGHUP:
				_ = send(tunnel.Signal("HUP"))
			}
		}
	}()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := in.Read(buf)
			if n > 0 && send(tunnel.Data(append([]byte(nil), buf[:n]...))) != nil {
				return
			}
			if err != nil {
				_ = send(tunnel.EOF())
				return
			}
		}
	}()
	for {
		f, err := t.Recv(ctx)
		if errors.Is(err, io.EOF) {
			return errors.New("the tunnel closed before the shell exited")
		}
		if errors.Is(err, client.ErrRevoked) {
			return err // the API's one line: "credential revoked: ..."
		}
		if err != nil {
			return fmt.Errorf("tunnel: %w", err)
		}
		switch b := f.GetBody().(type) {
		case *sessionv1.TunnelFrame_Data:
			if _, err := out.Write(b.Data); err != nil {
				return err
			}
		case *sessionv1.TunnelFrame_Exit:
			if b.Exit.GetSignal() != "" {
				return remoteExitError{code: 128 + signalNumber(b.Exit.GetSignal())}
			}
			if code := int(b.Exit.GetExitCode()); code != 0 {
				return remoteExitError{code: code}
			}
			return nil
		case *sessionv1.TunnelFrame_Error:
			return fmt.Errorf("tunnel: %s", b.Error)
		}
	}
}

// signalNumber is the number of a signal session.proto names.
func signalNumber(name string) int {
	for n, s := range map[string]syscall.Signal{"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "HUP": syscall.SIGHUP,
		"QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL} {
		if n == name {
			return int(s)
		}
	}
	if n, err := strconv.Atoi(name); err == nil {
		return n
	}
	return 0
}

// nodesPortForwardCmd is nodes port-forward NODE [LOCAL:]REMOTE.
func nodesPortForwardCmd(e *env, af *apiFlags) *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward NODE [LOCAL:]REMOTE",
		Short: "Forward a local TCP port to 127.0.0.1:REMOTE on a node, over the node's own session (audited)",
		Long: `port-forward listens on 127.0.0.1:LOCAL (LOCAL defaults to REMOTE; 0 picks a
free port, printed) and opens one tunnel per connection to 127.0.0.1:REMOTE
on NODE, until interrupted.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, remote, err := parsePorts(args[1])
			if err != nil {
				return usageError{err}
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			// The node is checked before the port is opened: a wrong or
			// offline node fails now, not at the first connection.
			n, err := c.NodesGet(cmd.Context(), &apiv1.NodeRequest{Id: args[0]})
			if err != nil {
				return err
			}
			if err := refuseSimulated(n.GetNode()); err != nil {
				return err
			}
			if n.GetNode().GetGatewayId() == "" {
				return fmt.Errorf("node %s holds no session (state %s): nothing to forward to until its bcd is connected", args[0], n.GetNode().GetState())
			}
			tcp, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(local)))
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			// Accepts that fail for a moment (descriptors exhausted) back
			// off and retry, with a line on stderr when it starts and ends.
			ln := accept.NewWatch(accept.Config{Log: slog.New(slog.NewTextHandler(e.stderr, nil))}).Wrap("port-forward", tcp)
			defer ln.Close()
			fmt.Fprintf(e.stdout, "Forwarding %s -> %s:%d\n", ln.Addr(), args[0], remote)
			return portForward(cmd.Context(), c, args[0], remote, ln, e.stderr)
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	return cmd
}

// refuseSimulated refuses a tunnel to a simulated node (a FakeDaemon of
// dev --sim, which reports bcd version sim.Version) before anything is
// opened or listens: it has no shell and no ports, and it offers no tunnels,
// so the API's answer for a bcd without tunnels ("upgrade bcd") would be
// wrong advice.
func refuseSimulated(n *apiv1.Node) error {
	if n.GetBcdVersion() == sim.Version {
		return fmt.Errorf("node %s is simulated (a FakeDaemon of dev --sim, bcd %s): it has no shell or ports to reach; shells and port-forwards need a real bcd (docs/tunnels.md)", n.GetId(), sim.Version)
	}
	return nil
}

// parsePorts reads [LOCAL:]REMOTE.
func parsePorts(s string) (local, remote int, err error) {
	l, r, found := strings.Cut(s, ":")
	if !found {
		r = l
	}
	remote, err = strconv.Atoi(r)
	if err != nil || remote < 1 || remote > 65535 {
		return 0, 0, fmt.Errorf("remote port %q: want 1 to 65535", r)
	}
	local, err = strconv.Atoi(l)
	if err != nil || local < 0 || local > 65535 {
		return 0, 0, fmt.Errorf("local port %q: want 0 to 65535", l)
	}
	return local, remote, nil
}

// portForward serves ln until ctx ends: each connection gets a tunnel. A
// tunnel the API ended because the token or the node was revoked (or a
// token the API no longer accepts) ends the whole port-forward with that
// error, printed once by main: every other tunnel would end the same way.
func portForward(ctx context.Context, c *client.Client, node string, remote int, ln net.Listener, stderr io.Writer) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if cause := context.Cause(ctx); errors.Is(cause, client.ErrRevoked) || isUnauthenticated(cause) {
				return cause
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		go func() {
			err := forwardOne(ctx, c, node, remote, conn.(*net.TCPConn))
			switch {
			case errors.Is(err, client.ErrRevoked) || isUnauthenticated(err):
				cancel(err)
			case err != nil && ctx.Err() == nil:
				fmt.Fprintln(stderr, "better-compute: port-forward:", err)
			}
		}()
	}
}

// isUnauthenticated reports an API refusal of the token itself (revoked,
// expired, unknown): nothing more can be forwarded with it.
func isUnauthenticated(err error) bool {
	var ae *client.Error
	return errors.As(err, &ae) && ae.Code == apiv1.CodeUnauthenticated
}

// forwardOne copies one local connection through its own tunnel.
func forwardOne(ctx context.Context, c *client.Client, node string, remote int, conn *net.TCPConn) error {
	defer conn.Close()
	t, err := c.OpenTunnel(ctx, &apiv1.CreateTunnelRequest{Node: node, Kind: tunnel.KindPort, Port: int32(remote)}, nil)
	if err != nil {
		return err
	}
	defer t.Close()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := conn.Read(buf)
			if n > 0 && t.Send(ctx, tunnel.Data(append([]byte(nil), buf[:n]...))) != nil {
				return
			}
			if err != nil {
				_ = t.Send(ctx, tunnel.EOF())
				return
			}
		}
	}()
	for {
		f, err := t.Recv(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch b := f.GetBody().(type) {
		case *sessionv1.TunnelFrame_Data:
			if _, err := conn.Write(b.Data); err != nil {
				return err
			}
		case *sessionv1.TunnelFrame_Eof:
			_ = conn.CloseWrite()
		case *sessionv1.TunnelFrame_Exit:
			return nil
		case *sessionv1.TunnelFrame_Error:
			return errors.New(b.Error)
		}
	}
}
