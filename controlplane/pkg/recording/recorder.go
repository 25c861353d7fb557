package recording

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Defaults of Config.
const (
	// DefaultMaxBytes is Config.MaxBytes' default: 64 MiB.
	DefaultMaxBytes = 64 << 20
	// MinMaxBytes is the least Config.MaxBytes: 64 KiB.
	MinMaxBytes = 64 << 10
	// DefaultFlushBytes is Config.FlushBytes' default: 32 KiB.
	DefaultFlushBytes = 32 << 10
	// DefaultFlushInterval is Config.FlushInterval's default.
	DefaultFlushInterval = time.Second
	// writeTimeout bounds one chunk's write.
	writeTimeout = 15 * time.Second
)

// EventOverhead is what each event costs beyond its data bytes, against
// Config.MaxBytes and the flush threshold: about its stored time and
// framing.
const EventOverhead = 16

// ErrLimit reports a recording that reached Config.MaxBytes.
var ErrLimit = errors.New("the recording reached its size limit")

// Store is what a Recorder writes.
type Store interface {
	RecordingCreate(ctx context.Context, p *store.RecordingCreateParams) (*store.Recording, error)
	RecordingChunkAdd(ctx context.Context, p *store.RecordingChunkAddParams) error
	RecordingEnd(ctx context.Context, p *store.RecordingEndParams) error
}

// Config configures a Recorder.
type Config struct {
	// Secret is the deployment secret the chunks are sealed under
	// (at least pki.MinSecretLen characters). Required.
	Secret string
	// MaxBytes bounds one recording, both ways together: each event
	// counts its data bytes plus EventOverhead (its time and framing), so
	// a flood of one-byte frames or window sizes is bounded too; past it
	// the recording fails with ErrLimit. At least
	// MinMaxBytes. Defaults to DefaultMaxBytes (64 MiB);
	// host.gateway.tunnels.recording.maxBytes.
	MaxBytes int64
	// FlushBytes is how many buffered data bytes make a chunk. Defaults
	// to DefaultFlushBytes (32 KiB); at most MaxChunk/2.
	FlushBytes int
	// FlushInterval is how often buffered events are stored when fewer
	// than FlushBytes wait. Defaults to 1 s.
	FlushInterval time.Duration
	// Now is the clock events are timed by. Defaults to time.Now.
	Now func() time.Time
}

// Params name the shell a recording is of.
type Params struct {
	TunnelID  string
	NodeID    string
	CreatedBy string
	AsRoot    bool
}

// Recorder records one shell. Its methods are safe for concurrent use.
type Recorder struct {
	cfg   Config
	st    Store
	id    string
	start time.Time
	// ctx bounds the writes; stop ends the flusher.
	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}

	// wmu orders the chunk writes: one at a time, in seq order.
	wmu sync.Mutex
	seq int

	mu       sync.Mutex
	buf      []*apiv1.RecordingEvent
	bufBytes int
	total    int64
	err      error
	closed   bool
	failed   chan struct{}
}

// Start creates a recording of the shell p names (in state recording)
// and starts storing its chunks every cfg.FlushInterval until Close. It
// fails when cfg is invalid or the row cannot be created.
func Start(ctx context.Context, cfg Config, st Store, p Params) (*Recorder, error) {
	cfg.MaxBytes = cmp.Or(cfg.MaxBytes, DefaultMaxBytes)
	cfg.FlushBytes = cmp.Or(cfg.FlushBytes, DefaultFlushBytes)
	cfg.FlushInterval = cmp.Or(cfg.FlushInterval, DefaultFlushInterval)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch {
	case cfg.Secret == "":
		return nil, errors.New("start recording: no deployment secret to seal it with")
	case cfg.MaxBytes < MinMaxBytes:
		return nil, fmt.Errorf("start recording: max bytes %d is under %d", cfg.MaxBytes, MinMaxBytes)
	case cfg.FlushBytes < 1 || cfg.FlushBytes > MaxChunk/2:
		return nil, fmt.Errorf("start recording: flush bytes %d: want 1 to %d", cfg.FlushBytes, MaxChunk/2)
	}
	now := cfg.Now()
	rec, err := st.RecordingCreate(ctx, &store.RecordingCreateParams{ID: store.NewID("rec"), TunnelID: p.TunnelID, NodeID: p.NodeID,
		CreatedBy: p.CreatedBy, AsRoot: p.AsRoot, Now: &now})
	if err != nil {
		return nil, fmt.Errorf("start recording: %w", err)
	}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r := &Recorder{cfg: cfg, st: st, id: rec.ID, start: now, ctx: context.WithoutCancel(ctx), stop: stop,
		done: make(chan struct{}), failed: make(chan struct{})}
	go r.flusher(wctx)
	return r, nil
}

// ID returns the recording's id; "" for a nil Recorder (a shell not
// recorded).
func (r *Recorder) ID() string {
	if r == nil {
		return ""
	}
	return r.id
}

// Failed is closed when recording fails; Err says why.
func (r *Recorder) Failed() <-chan struct{} { return r.failed }

// Err returns why recording failed, nil while it has not (and for a nil
// Recorder).
func (r *Recorder) Err() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Input records bytes typed (client to node).
func (r *Recorder) Input(b []byte) error {
	return r.add(&apiv1.RecordingEvent{Body: &apiv1.RecordingEvent_Input{Input: b}}, len(b))
}

// Output records bytes printed (node to client).
func (r *Recorder) Output(b []byte) error {
	return r.add(&apiv1.RecordingEvent{Body: &apiv1.RecordingEvent_Output{Output: b}}, len(b))
}

// Resize records the client's window size.
func (r *Recorder) Resize(rows, cols uint32) error {
	return r.add(&apiv1.RecordingEvent{Body: &apiv1.RecordingEvent_Resize{Resize: &apiv1.RecordingWindow{Rows: rows, Cols: cols}}}, 0)
}

// add times and buffers ev (of n data bytes), storing the buffer when it
// holds FlushBytes. It returns the recording's failure, if any.
func (r *Recorder) add(ev *apiv1.RecordingEvent, n int) error {
	if err := Check(&apiv1.RecordingEvent{Time: durationpb.New(0), Body: ev.Body}); err != nil {
		return r.fail(err)
	}
	r.mu.Lock()
	if r.err != nil {
		defer r.mu.Unlock()
		return r.err
	}
	if r.closed {
		r.mu.Unlock()
		return errors.New("recording closed")
	}
	// Each event costs its data and its framing, so that a stream of
	// tiny frames or resizes is bounded as tightly as its bytes.
	if cost := int64(n + EventOverhead); r.total+cost > r.cfg.MaxBytes {
		r.mu.Unlock()
		return r.fail(fmt.Errorf("%w of %d bytes", ErrLimit, r.cfg.MaxBytes))
	}
	r.total += int64(n + EventOverhead)
	// Times never go back, even on a clock stepped backwards.
	ev.Time = durationpb.New(max(r.cfg.Now().Sub(r.start), 0))
	if k := len(r.buf); k > 0 && ev.Time.AsDuration() < r.buf[k-1].Time.AsDuration() {
		ev.Time = r.buf[k-1].Time
	}
	r.buf = append(r.buf, ev)
	r.bufBytes += n + EventOverhead
	full := r.bufBytes >= r.cfg.FlushBytes
	r.mu.Unlock()
	if full {
		return r.flush()
	}
	return nil
}

// flush stores the buffered events as the next chunk.
func (r *Recorder) flush() error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	if r.err != nil {
		defer r.mu.Unlock()
		return r.err
	}
	events, n := r.buf, r.bufBytes
	r.buf, r.bufBytes = nil, 0
	r.mu.Unlock()
	if len(events) == 0 {
		return nil
	}
	var bytes int64
	for _, ev := range events {
		bytes += int64(len(ev.GetInput()) + len(ev.GetOutput()))
	}
	sealed, err := Seal(r.cfg.Secret, r.id, r.seq, events)
	if err == nil {
		ctx, cancel := context.WithTimeout(r.ctx, writeTimeout)
		err = r.st.RecordingChunkAdd(ctx, &store.RecordingChunkAddParams{RecordingID: r.id, Seq: r.seq, Sealed: sealed, Bytes: bytes})
		cancel()
	}
	if err != nil {
		return r.fail(fmt.Errorf("store chunk %d (%d bytes): %w", r.seq, n, err))
	}
	r.seq++
	return nil
}

// fail records the first failure and closes Failed.
func (r *Recorder) fail(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
		r.buf, r.bufBytes = nil, 0
		close(r.failed)
	}
	return r.err
}

// flusher stores what waits every FlushInterval until ctx ends.
func (r *Recorder) flusher(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if r.flush() != nil {
				return
			}
		}
	}
}

// Close stores what waits and records the end: complete with reason (why
// the shell ended), or failed with the failure. It returns the failure,
// if any. Events after Close are refused.
func (r *Recorder) Close(reason string) error {
	r.stop()
	<-r.done
	// Closed before the last flush: an event a hop still sends now is
	// refused, not lost after the flush or written after the end.
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	ferr := r.flush()
	end := &store.RecordingEndParams{ID: r.id, State: store.RecordingComplete, Reason: reason}
	if ferr != nil {
		end.State, end.Reason = store.RecordingFailed, ferr.Error()
	}
	ctx, cancel := context.WithTimeout(r.ctx, writeTimeout)
	defer cancel()
	if err := r.st.RecordingEnd(ctx, end); err != nil {
		return errors.Join(ferr, fmt.Errorf("record the end of recording %s: %w", r.id, err))
	}
	return ferr
}

// Hops returns client and node wrapped so that each frame sent through
// them is recorded first: data sent to the node as input, window sizes as
// resizes, data sent to the client as output. When strict, a frame is
// refused (its Send fails) once recording has failed, so nothing passes
// unrecorded; otherwise frames pass on after a failure, unrecorded.
func Hops(r *Recorder, client, node tunnel.Hop, strict bool) (tunnel.Hop, tunnel.Hop) {
	return &hop{Hop: client, r: r, strict: strict, toNode: false}, &hop{Hop: node, r: r, strict: strict, toNode: true}
}

// hop records the frames sent through it.
type hop struct {
	tunnel.Hop
	r      *Recorder
	strict bool
	toNode bool
}

func (h *hop) Send(f *sessionv1.TunnelFrame) error {
	var err error
	switch b := f.GetBody().(type) {
	case *sessionv1.TunnelFrame_Data:
		if h.toNode {
			err = h.r.Input(b.Data)
		} else {
			err = h.r.Output(b.Data)
		}
	case *sessionv1.TunnelFrame_Resize:
		if h.toNode {
			err = h.r.Resize(b.Resize.GetRows(), b.Resize.GetCols())
		}
	}
	if err != nil && h.strict {
		return fmt.Errorf("recording failed: %w", err)
	}
	return h.Hop.Send(f)
}
