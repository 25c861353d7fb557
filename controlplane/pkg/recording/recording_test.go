package recording_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/recording"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

var secret = strings.Repeat("s", pki.MinSecretLen)

// fakeClock advances by step on every read.
type fakeClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

// readAll opens every chunk of recording id.
func readAll(t *testing.T, st store.Store, key, id string) []*apiv1.RecordingEvent {
	t.Helper()
	chunks, err := st.RecordingChunks(context.Background(), &store.RecordingChunksParams{RecordingID: id, After: -1, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []*apiv1.RecordingEvent
	for i, c := range chunks {
		if c.Seq != i {
			t.Fatalf("chunk %d has seq %d", i, c.Seq)
		}
		evs, err := recording.Open(key, c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, evs...)
	}
	return out
}

// TestRecorderRecordsInOrder: input, output and resizes come back from
// the sealed chunks in the order they were given, with their times, across
// chunk boundaries; the row counts the data bytes and ends complete.
func TestRecorderRecordsInOrder(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0), step: 250 * time.Millisecond}
	r, err := recording.Start(ctx, recording.Config{Secret: secret, FlushBytes: 100, FlushInterval: time.Hour, Now: clk.now}, st,
		recording.Params{TunnelID: "tun_1", NodeID: "node_1", CreatedBy: "token:tok_1"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID(), "rec_") {
		t.Fatalf("id %q", r.ID())
	}
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	check(r.Resize(24, 80))
	for i := range 10 {
		check(r.Input([]byte{'a' + byte(i)}))
		check(r.Output(bytes.Repeat([]byte{'A' + byte(i)}, 30)))
	}
	check(r.Resize(40, 120))
	check(r.Close("exit"))
	if err := r.Input([]byte("late")); err == nil {
		t.Fatal("input after Close was taken")
	}

	evs := readAll(t, st, secret, r.ID())
	if len(evs) != 22 {
		t.Fatalf("%d events, want 22", len(evs))
	}
	if w := evs[0].GetResize(); w.GetRows() != 24 || w.GetCols() != 80 {
		t.Fatalf("first event %v, want resize 24x80", evs[0])
	}
	for i := range 10 {
		in, out := evs[1+2*i], evs[2+2*i]
		if string(in.GetInput()) != string(rune('a'+i)) || string(out.GetOutput()) != strings.Repeat(string(rune('A'+i)), 30) {
			t.Fatalf("events %d, %d = %v, %v", 1+2*i, 2+2*i, in, out)
		}
	}
	for i := 1; i < len(evs); i++ {
		if d := evs[i].GetTime().AsDuration() - evs[i-1].GetTime().AsDuration(); d != 250*time.Millisecond {
			t.Fatalf("event %d is %v after the one before, want 250ms (one clock step)", i, d)
		}
	}
	rec, err := st.RecordingGet(ctx, r.ID())
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.RecordingComplete || rec.Reason != "exit" || rec.Bytes != 310 || rec.Chunks < 3 || rec.TunnelID != "tun_1" {
		t.Fatalf("recording row = %+v, want complete, 310 bytes in several chunks", rec)
	}
}

// TestRecorderFlushesOnTime: a few bytes are stored within the flush
// interval, without Close.
func TestRecorderFlushesOnTime(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	r, err := recording.Start(ctx, recording.Config{Secret: secret, FlushInterval: 10 * time.Millisecond}, st, recording.Params{NodeID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close("test")
	if err := r.Output([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := st.RecordingGet(ctx, r.ID())
		if err != nil {
			t.Fatal(err)
		}
		if rec.Chunks == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the buffered output was never stored")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if evs := readAll(t, st, secret, r.ID()); len(evs) != 1 || string(evs[0].GetOutput()) != "hello" {
		t.Fatalf("events = %v", evs)
	}
}

// TestRecorderLimit: past MaxBytes the recording fails with ErrLimit,
// Failed closes, a strict hop refuses the frame and a lenient one passes
// it; the row ends failed, keeping what came before.
func TestRecorderLimit(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	r, err := recording.Start(ctx, recording.Config{Secret: secret, MaxBytes: recording.MinMaxBytes}, st, recording.Params{NodeID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	// Two frames that fill the limit exactly, their framing counted.
	big := bytes.Repeat([]byte("x"), recording.MinMaxBytes/2-recording.EventOverhead)
	sink := &sinkHop{}
	strictClient, _ := recording.Hops(r, sink, sink, true)
	if err := strictClient.Send(tunnel.Data(big)); err != nil {
		t.Fatal(err)
	}
	if err := strictClient.Send(tunnel.Data(big)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Failed():
		t.Fatal("failed at exactly MaxBytes")
	default:
	}
	err = strictClient.Send(tunnel.Data([]byte("one more")))
	if !errors.Is(err, recording.ErrLimit) {
		t.Fatalf("a strict hop's send past the limit: %v, want ErrLimit", err)
	}
	<-r.Failed()
	if n := sink.count(); n != 2 {
		t.Fatalf("%d frames passed the strict hop, want 2 (not the one past the limit)", n)
	}
	lenient, _ := recording.Hops(r, sink, sink, false)
	if err := lenient.Send(tunnel.Data([]byte("unrecorded"))); err != nil {
		t.Fatalf("a lenient hop after a failure: %v", err)
	}
	if err := r.Close("exit"); !errors.Is(err, recording.ErrLimit) {
		t.Fatalf("Close: %v, want ErrLimit", err)
	}
	rec, _ := st.RecordingGet(ctx, r.ID())
	if rec.State != store.RecordingFailed || !strings.Contains(rec.Reason, "size limit") {
		t.Fatalf("recording = %+v, want failed at its size limit", rec)
	}
}

// TestRecorderLimitCountsResizes: window sizes carry no data, but each
// costs its framing, so a client sending them in a loop reaches the limit.
func TestRecorderLimitCountsResizes(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	r, err := recording.Start(ctx, recording.Config{Secret: secret, MaxBytes: recording.MinMaxBytes}, st, recording.Params{NodeID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close("exit")
	for i := range recording.MinMaxBytes/recording.EventOverhead + 1 {
		if err := r.Resize(24, uint32(80+i%2)); err != nil {
			if !errors.Is(err, recording.ErrLimit) {
				t.Fatalf("resize %d: %v, want ErrLimit", i, err)
			}
			return
		}
	}
	t.Fatal("resizes past MaxBytes were all recorded")
}

// failingStore is the real SQLite store whose chunk writes fail once
// fail is set.
type failingStore struct {
	store.Store
	mu   sync.Mutex
	fail bool
}

func (f *failingStore) RecordingChunkAdd(ctx context.Context, p *store.RecordingChunkAddParams) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("disk on fire")
	}
	return f.Store.RecordingChunkAdd(ctx, p)
}

// TestRecorderStoreFailure: a chunk the store refuses (on the timed
// flush, with no further frame) fails the recording: Failed closes with
// the store's error and the row ends failed.
func TestRecorderStoreFailure(t *testing.T) {
	ctx := context.Background()
	st := &failingStore{Store: sqlitetest.Open(t)}
	r, err := recording.Start(ctx, recording.Config{Secret: secret, FlushInterval: 5 * time.Millisecond}, st, recording.Params{NodeID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Output([]byte("before")); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	st.fail = true
	st.mu.Unlock()
	if err := r.Input([]byte("during")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Failed():
	case <-time.After(30 * time.Second):
		t.Fatal("a refused chunk never failed the recording")
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Err = %v", err)
	}
	r.Close("exit")
	rec, _ := st.RecordingGet(ctx, r.ID())
	if rec.State != store.RecordingFailed || !strings.Contains(rec.Reason, "disk on fire") {
		t.Fatalf("recording = %+v, want failed", rec)
	}
}

// TestOpenRefusesMovedChunks: a chunk opens only under its secret, its
// recording and its number.
func TestOpenRefusesMovedChunks(t *testing.T) {
	evs := []*apiv1.RecordingEvent{{Time: durationpb.New(time.Second), Body: &apiv1.RecordingEvent_Output{Output: []byte("x")}}}
	sealed, err := recording.Seal(secret, "rec_a", 3, evs)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := recording.Open(secret, &store.RecordingChunk{RecordingID: "rec_a", Seq: 3, Sealed: sealed}); err != nil || !proto.Equal(got[0], evs[0]) {
		t.Fatalf("Open = %v, %v", got, err)
	}
	for _, c := range []struct {
		what   string
		secret string
		chunk  *store.RecordingChunk
	}{
		{"another recording", secret, &store.RecordingChunk{RecordingID: "rec_b", Seq: 3, Sealed: sealed}},
		{"another place", secret, &store.RecordingChunk{RecordingID: "rec_a", Seq: 2, Sealed: sealed}},
		{"another secret", strings.Repeat("t", pki.MinSecretLen), &store.RecordingChunk{RecordingID: "rec_a", Seq: 3, Sealed: sealed}},
	} {
		if _, err := recording.Open(c.secret, c.chunk); !errors.Is(err, pki.ErrSealOpen) {
			t.Errorf("%s: %v, want ErrSealOpen", c.what, err)
		}
	}
}

// TestParseRefuses: Parse's limits.
func TestParseRefuses(t *testing.T) {
	at := durationpb.New(time.Second)
	for _, c := range []struct {
		what string
		evs  []*apiv1.RecordingEvent
	}{
		{"no body", []*apiv1.RecordingEvent{{Time: at}}},
		{"no time", []*apiv1.RecordingEvent{{Body: &apiv1.RecordingEvent_Input{Input: []byte("x")}}}},
		{"negative time", []*apiv1.RecordingEvent{{Time: durationpb.New(-time.Second), Body: &apiv1.RecordingEvent_Input{Input: []byte("x")}}}},
		{"time going back", []*apiv1.RecordingEvent{{Time: at, Body: &apiv1.RecordingEvent_Input{Input: []byte("x")}},
			{Time: durationpb.New(0), Body: &apiv1.RecordingEvent_Input{Input: []byte("y")}}}},
		{"big output", []*apiv1.RecordingEvent{{Time: at, Body: &apiv1.RecordingEvent_Output{Output: make([]byte, tunnel.MaxData+1)}}}},
		{"zero window", []*apiv1.RecordingEvent{{Time: at, Body: &apiv1.RecordingEvent_Resize{Resize: &apiv1.RecordingWindow{Rows: 0, Cols: 80}}}}},
	} {
		b, _ := proto.Marshal(&apiv1.RecordingChunk{Events: c.evs})
		if _, err := recording.Parse(b); !errors.Is(err, recording.ErrChunk) {
			t.Errorf("%s: %v, want ErrChunk", c.what, err)
		}
	}
	if _, err := recording.Parse(make([]byte, recording.MaxChunk+1)); !errors.Is(err, recording.ErrChunk) {
		t.Errorf("an oversized chunk: %v, want ErrChunk", err)
	}
}

// FuzzParse: Parse never panics, and what it accepts passes Check and
// marshals back to a chunk it accepts again.
func FuzzParse(f *testing.F) {
	at := durationpb.New(1500 * time.Millisecond)
	seed, _ := proto.Marshal(&apiv1.RecordingChunk{Events: []*apiv1.RecordingEvent{
		{Time: durationpb.New(0), Body: &apiv1.RecordingEvent_Resize{Resize: &apiv1.RecordingWindow{Rows: 24, Cols: 80}}},
		{Time: at, Body: &apiv1.RecordingEvent_Input{Input: []byte("ls\r")}},
		{Time: at, Body: &apiv1.RecordingEvent_Output{Output: []byte("a b c\r\n")}},
	}})
	f.Add(seed)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		evs, err := recording.Parse(b)
		if err != nil {
			if !errors.Is(err, recording.ErrChunk) {
				t.Fatalf("error %v is not ErrChunk", err)
			}
			return
		}
		for _, ev := range evs {
			if err := recording.Check(ev); err != nil {
				t.Fatalf("accepted event fails Check: %v", err)
			}
		}
		again, err := proto.Marshal(&apiv1.RecordingChunk{Events: evs})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := recording.Parse(again); err != nil && len(again) <= recording.MaxChunk {
			t.Fatalf("re-marshalled chunk refused: %v", err)
		}
	})
}

// sinkHop counts the frames sent to it.
type sinkHop struct {
	mu sync.Mutex
	n  int
}

func (s *sinkHop) Send(*sessionv1.TunnelFrame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return nil
}

func (s *sinkHop) Recv() (*sessionv1.TunnelFrame, error) { select {} }

func (s *sinkHop) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}
