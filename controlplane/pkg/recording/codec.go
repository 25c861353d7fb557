package recording

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// MaxChunk is the most bytes of one chunk's plaintext. A Recorder's chunks
// stay under it (Config.FlushBytes and one frame's tunnel.MaxData); Parse
// refuses more.
const MaxChunk = 256 << 10

// ErrChunk reports stored recording data that is malformed or out of
// limits.
var ErrChunk = errors.New("invalid recording chunk")

// AAD returns the additional data chunk seq of recording id is sealed
// with: "better-compute recording <id> <seq>".
func AAD(id string, seq int) []byte {
	return fmt.Appendf(nil, "better-compute recording %s %d", id, seq)
}

// Seal marshals events as chunk seq of recording id and seals them under
// secret (pki.Seal). It fails with pki.ErrSecretTooShort for a short
// secret.
func Seal(secret, id string, seq int, events []*apiv1.RecordingEvent) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&apiv1.RecordingChunk{Events: events})
	if err != nil {
		return nil, fmt.Errorf("marshal recording chunk: %w", err)
	}
	sealed, err := pki.Seal(secret, b, AAD(id, seq))
	if err != nil {
		return nil, fmt.Errorf("seal recording chunk: %w", err)
	}
	return sealed, nil
}

// Open unseals a stored chunk under secret and parses its events (Parse).
// It fails with pki.ErrSealOpen when the chunk does not authenticate
// (another deployment secret, a chunk moved or tampered with) and ErrChunk
// when its plaintext is not a valid chunk.
func Open(secret string, c *store.RecordingChunk) ([]*apiv1.RecordingEvent, error) {
	b, err := pki.Open(secret, c.Sealed, AAD(c.RecordingID, c.Seq))
	if err != nil {
		return nil, fmt.Errorf("open chunk %d of recording %s: %w", c.Seq, c.RecordingID, err)
	}
	events, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("chunk %d of recording %s: %w", c.Seq, c.RecordingID, err)
	}
	return events, nil
}

// Parse decodes a chunk's plaintext and checks it: at most MaxChunk bytes,
// every event valid (Check) and no event earlier than the one before it.
// It fails with ErrChunk.
func Parse(b []byte) ([]*apiv1.RecordingEvent, error) {
	if len(b) > MaxChunk {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrChunk, len(b), MaxChunk)
	}
	c := &apiv1.RecordingChunk{}
	if err := proto.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrChunk, err)
	}
	var last int64
	for i, ev := range c.GetEvents() {
		if err := Check(ev); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		t := ev.GetTime().AsDuration().Nanoseconds()
		if t < last {
			return nil, fmt.Errorf("%w: event %d at %v is before the one before it", ErrChunk, i, ev.GetTime().AsDuration())
		}
		last = t
	}
	return c.GetEvents(), nil
}

// Check reports an event that is not exactly one of input, output (each
// at most tunnel.MaxData bytes) or resize (1 to tunnel.MaxWindow rows and
// columns), at a valid, non-negative time. It fails with ErrChunk.
func Check(ev *apiv1.RecordingEvent) error {
	if ev.GetTime() == nil {
		return fmt.Errorf("%w: no time", ErrChunk)
	}
	if err := ev.GetTime().CheckValid(); err != nil || ev.GetTime().AsDuration() < 0 {
		return fmt.Errorf("%w: time %v", ErrChunk, ev.GetTime())
	}
	switch b := ev.GetBody().(type) {
	case *apiv1.RecordingEvent_Input:
		if len(b.Input) > tunnel.MaxData {
			return fmt.Errorf("%w: %d input bytes, at most %d", ErrChunk, len(b.Input), tunnel.MaxData)
		}
	case *apiv1.RecordingEvent_Output:
		if len(b.Output) > tunnel.MaxData {
			return fmt.Errorf("%w: %d output bytes, at most %d", ErrChunk, len(b.Output), tunnel.MaxData)
		}
	case *apiv1.RecordingEvent_Resize:
		r, c := b.Resize.GetRows(), b.Resize.GetCols()
		if r == 0 || c == 0 || r > tunnel.MaxWindow || c > tunnel.MaxWindow {
			return fmt.Errorf("%w: window %dx%d, want 1 to %d each", ErrChunk, r, c, tunnel.MaxWindow)
		}
	default:
		return fmt.Errorf("%w: no body", ErrChunk)
	}
	return nil
}
