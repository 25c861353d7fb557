// Package tunnel holds what every hop of a tunnel shares (docs/tunnels.md):
// the frame format (a sessionv1.TunnelFrame, one binary WebSocket message
// or one gRPC message each), its parser with the limits every hop enforces,
// and Pipe, which copies frames between two hops counting bytes each way.
package tunnel

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Kinds of tunnel (TunnelOpen.kind), as session.proto names them.
const (
	KindShell = sessionv1.TunnelKindShell
	KindPort  = sessionv1.TunnelKindPort
)

// CloseRevoked is the WebSocket close status with which the api ends a
// client's tunnel because the API token that opened it, or its node, was
// revoked, deleted or expired; the close reason is the one line to show.
// It is 1008, policy violation (RFC 6455 §7.4.1).
const CloseRevoked = 1008

// Limits every hop enforces.
const (
	// MaxData is the most bytes of one data frame.
	MaxData = 64 << 10
	// MaxFrame is the most bytes of one encoded frame.
	MaxFrame = MaxData + 1024
	// MaxWindow bounds a terminal's rows and columns.
	MaxWindow = 10000
)

// Signals are the signal names a client may send a shell.
var Signals = map[string]bool{"INT": true, "TERM": true, "HUP": true, "QUIT": true, "KILL": true, "WINCH": true,
	"TSTP": true, "CONT": true}

// ErrFrame reports a malformed or out-of-limits frame.
var ErrFrame = errors.New("invalid tunnel frame")

// Parse decodes one frame and checks it: at most MaxFrame bytes, a known
// body (or the first frame's tunnel id alone), data of at most MaxData
// bytes, a window of 1 to MaxWindow rows and columns, a signal from
// Signals. It fails with ErrFrame.
func Parse(b []byte) (*sessionv1.TunnelFrame, error) {
	if len(b) > MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrFrame, len(b), MaxFrame)
	}
	f := &sessionv1.TunnelFrame{}
	if err := proto.Unmarshal(b, f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFrame, err)
	}
	if err := Check(f); err != nil {
		return nil, err
	}
	return f, nil
}

// Check applies Parse's limits to a decoded frame.
func Check(f *sessionv1.TunnelFrame) error {
	switch b := f.GetBody().(type) {
	case nil:
		if f.GetTunnelId() == "" {
			return fmt.Errorf("%w: no body", ErrFrame)
		}
	case *sessionv1.TunnelFrame_Data:
		if len(b.Data) > MaxData {
			return fmt.Errorf("%w: %d data bytes, at most %d", ErrFrame, len(b.Data), MaxData)
		}
	case *sessionv1.TunnelFrame_Resize:
		r, c := b.Resize.GetRows(), b.Resize.GetCols()
		if r == 0 || c == 0 || r > MaxWindow || c > MaxWindow {
			return fmt.Errorf("%w: window %dx%d, want 1 to %d each", ErrFrame, r, c, MaxWindow)
		}
	case *sessionv1.TunnelFrame_Signal:
		if !Signals[b.Signal] {
			return fmt.Errorf("%w: unknown signal %q", ErrFrame, b.Signal)
		}
	case *sessionv1.TunnelFrame_Eof, *sessionv1.TunnelFrame_Exit:
	case *sessionv1.TunnelFrame_Error:
		if len(b.Error) > 4096 {
			return fmt.Errorf("%w: error text of %d bytes", ErrFrame, len(b.Error))
		}
	default:
		return fmt.Errorf("%w: unknown body", ErrFrame)
	}
	return nil
}

// Encode marshals f (deterministically).
func Encode(f *sessionv1.TunnelFrame) []byte {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(f)
	return b
}

// Data, Resize, Signal, EOF, Exit and Error build frames.
func Data(b []byte) *sessionv1.TunnelFrame {
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Data{Data: b}}
}

// Resize builds a window size frame.
func Resize(rows, cols uint32) *sessionv1.TunnelFrame {
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Resize{Resize: &sessionv1.WindowSize{Rows: rows, Cols: cols}}}
}

// Signal builds a signal frame.
func Signal(name string) *sessionv1.TunnelFrame {
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Signal{Signal: name}}
}

// EOF builds a half-close frame.
func EOF() *sessionv1.TunnelFrame {
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Eof{Eof: true}}
}

// Exit builds an exit frame.
func Exit(code int32, signal string) *sessionv1.TunnelFrame {
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Exit{Exit: &sessionv1.TunnelExit{ExitCode: code, Signal: signal}}}
}

// Error builds an error frame.
func Error(msg string) *sessionv1.TunnelFrame {
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Error{Error: msg}}
}
