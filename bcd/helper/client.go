package helper

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/better-compute/better-compute/bcd/process"
)

// Client talks to the helper.
type Client struct {
	// Socket is the helper's socket. Defaults to DefaultSocket.
	Socket string
}

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", cmp.Or(c.Socket, DefaultSocket))
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, ErrUnavailable
		}
		return nil, fmt.Errorf("dial root helper: %w", err)
	}
	return conn, nil
}

// do sends req and passes each output frame to out; it returns the last
// frame. Ending ctx closes the connection, which cancels the operation.
func (c *Client) do(ctx context.Context, req Request, out func(Frame)) (Frame, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return Frame{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	dec := json.NewDecoder(bufio.NewReader(conn))
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		// A helper that refuses this process answers and closes without
		// reading the request, which can fail the write (EPIPE); its
		// answer is still there to read.
		var f Frame
		if derr := dec.Decode(&f); derr == nil && f.Done {
			return f, nil
		}
		return Frame{}, fmt.Errorf("send to root helper: %w", err)
	}
	for {
		var f Frame
		if err := dec.Decode(&f); err != nil {
			if ctx.Err() != nil {
				return Frame{Done: true, ExitCode: -1, Cancelled: true}, nil
			}
			return Frame{}, fmt.Errorf("root helper closed the connection: %w", err)
		}
		if f.Done {
			return f, nil
		}
		if out != nil {
			out(f)
		}
	}
}

// Ping checks the helper answers and accepts this process.
func (c *Client) Ping(ctx context.Context) error {
	f, err := c.do(ctx, Request{Op: OpPing}, nil)
	if err != nil {
		return err
	}
	if f.Error != "" {
		return fmt.Errorf("%w: %s", ErrRefused, f.Error)
	}
	return nil
}

// Grant asks the helper for a grant for id (OpGrant): the right to start
// one root process for that command or tunnel within GrantTTL.
func (c *Client) Grant(ctx context.Context, id string) (string, error) {
	f, err := c.do(ctx, Request{Op: OpGrant, Grant: &GrantRequest{ID: id}}, nil)
	if err != nil {
		return "", err
	}
	if f.Error != "" || f.Grant == "" {
		return "", fmt.Errorf("%w: grant for %s: %s", ErrRefused, id, f.Error)
	}
	return f.Grant, nil
}

// Exec runs spec through the helper as the command user (the helper's
// --command-user); spec.Credential, Home and User are the helper's to set.
func (c *Client) Exec(ctx context.Context, spec process.Spec, out func(stream int, data []byte)) process.Result {
	return c.exec(ctx, OpExecUser, &ExecSpec{Argv: spec.Argv, Env: spec.Env, Dir: spec.Dir, OutputLimit: spec.OutputLimit}, out)
}

// ExecRoot runs spec as root through the helper, for command id: it asks
// for a grant bound to id first (Grant), and the helper checks it.
func (c *Client) ExecRoot(ctx context.Context, id string, spec process.Spec, out func(stream int, data []byte)) process.Result {
	g, err := c.Grant(ctx, id)
	if err != nil {
		return process.Result{ExitCode: -1, Err: err}
	}
	return c.exec(ctx, OpExec, &ExecSpec{Argv: spec.Argv, Env: spec.Env, Dir: spec.Dir, OutputLimit: spec.OutputLimit,
		CommandID: id, Grant: g}, out)
}

func (c *Client) exec(ctx context.Context, op string, spec *ExecSpec, out func(stream int, data []byte)) process.Result {
	f, err := c.do(ctx, Request{Op: op, Exec: spec}, func(f Frame) { out(f.Stream, f.Data) })
	if err != nil {
		return process.Result{ExitCode: -1, Err: err}
	}
	res := process.Result{ExitCode: f.ExitCode, Truncated: f.Truncated, Cancelled: f.Cancelled}
	if ctx.Err() != nil {
		res.Cancelled, res.Err = true, ctx.Err()
	} else if f.Error != "" {
		res.Err = errors.New(f.Error)
	}
	return res
}

// Reboot asks the helper to reboot the machine.
func (c *Client) Reboot(ctx context.Context) error {
	f, err := c.do(ctx, Request{Op: OpReboot}, nil)
	if err != nil {
		return err
	}
	if f.Error != "" {
		return errors.New(f.Error)
	}
	return nil
}
