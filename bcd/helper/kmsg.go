package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
)

// kmsgXid streams the kernel log's NVRM Xid, PCIe AER and mlx5_core error
// records (OpKmsgXid, kmsg.IsHealthRecord): every one
// the kernel still holds, then new ones until the client closes the
// connection. Nothing else of the kernel log leaves the helper: bcd's unit
// sets ProtectKernelLogs=yes, and this is the one view of the log it gets.
func (s *Server) kmsgXid(ctx context.Context, enc *json.Encoder) {
	err := kmsg.Follow(ctx, s.cfg.KernelLog, func(rec string) {
		if kmsg.IsHealthRecord(rec) {
			_ = enc.Encode(Frame{Data: []byte(rec)})
		}
	})
	f := Frame{Done: true, Cancelled: ctx.Err() != nil}
	if err != nil {
		f.ExitCode, f.Error = -1, err.Error()
	}
	_ = enc.Encode(f)
}

// FollowKernelLog streams the kernel log's NVRM Xid records through the
// helper (OpKmsgXid), from the oldest the kernel holds, passing each raw
// /dev/kmsg record to fn, until ctx ends (nil then). It implements
// gpu.KernelLog for an unprivileged bcd. Errors: ErrUnavailable without a
// helper, an error wrapping ErrRefused when the helper refuses, or the
// helper's error reading the log.
func (c *Client) FollowKernelLog(ctx context.Context, fn func(record string)) error {
	f, err := c.do(ctx, Request{Op: OpKmsgXid}, func(f Frame) { fn(string(f.Data)) })
	switch {
	case err != nil:
		return err
	case ctx.Err() != nil:
		return nil
	case f.Error != "":
		if f.ExitCode == -1 && !f.Cancelled && isRefusal(f.Error) {
			return fmt.Errorf("%w: %s", ErrRefused, f.Error)
		}
		return errors.New("root helper: " + f.Error)
	}
	return errors.New("root helper: kernel log stream ended")
}

// isRefusal reports whether a helper error is a refusal (another uid, an
// operation off the allow-list) rather than a failure of the operation.
func isRefusal(msg string) bool {
	return strings.Contains(msg, "may not use the root helper") || strings.Contains(msg, "not on the root helper's allow-list")
}
