package storetest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// testCommandOutputBounds: a command keeps at most its output limit (an
// exec's outputLimitBytes, else sessionv1.DefaultOutputLimitBytes) and at
// most store.MaxOutputChunk of one chunk, marking the rest truncated, and
// reads back in pages of at most store.MaxOutputPage that follow on from
// each other (issue 28).
func testCommandOutputBounds(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	addNode(ctx, t, h, pool, "node_1")
	enqueue := func(kind, spec string) *store.Command {
		t.Helper()
		c := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1"}, Kind: kind,
			SessionSpec: []byte(spec), Timeout: time.Hour}))[0]
		must(h.Store.CommandSetState(ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandRunning}))
		return c
	}
	appendOut := func(id string, seq int64, data []byte) int {
		t.Helper()
		return must(h.Store.CommandAppendOutput(ctx, &store.CommandOutputChunk{CommandID: id, NodeID: "node_1", Seq: seq,
			Stream: store.StreamStdout, Data: data}))
	}

	// An exec limited to 100 bytes: 60 + 60 keeps 60 + 40, then nothing.
	small := enqueue(sessionv1.KindExec, `{"exec":{"argv":["yes"],"outputLimitBytes":"100"}}`)
	chunk := bytes.Repeat([]byte("y"), 60)
	if a, b, c := appendOut(small.ID, 1, chunk), appendOut(small.ID, 2, chunk), appendOut(small.ID, 3, chunk); a != 60 || b != 40 || c != 0 {
		t.Fatalf("a 100-byte limit kept %d, %d, %d of three 60-byte chunks, want 60, 40, 0", a, b, c)
	}
	if got := must(h.Store.CommandGet(ctx, small.ID)); got.OutputBytes != 100 || !got.OutputTruncated {
		t.Fatalf("after the limit: output_bytes %d truncated %v, want 100 true", got.OutputBytes, got.OutputTruncated)
	}
	// The node's own result saying nothing was cut does not hide the cut.
	zero := 0
	must(h.Store.CommandFinish(ctx, &store.CommandFinishParams{ID: small.ID, State: store.CommandSucceeded, ExitCode: &zero}))
	if got := must(h.Store.CommandGet(ctx, small.ID)); !got.OutputTruncated {
		t.Fatal("the result cleared output_truncated")
	}

	// A kind without a limit of its own keeps the default; one chunk
	// keeps at most MaxOutputChunk.
	other := enqueue(sessionv1.KindInventoryRefresh, `{}`)
	huge := bytes.Repeat([]byte("z"), store.MaxOutputChunk+10)
	if n := appendOut(other.ID, 1, huge); n != store.MaxOutputChunk {
		t.Fatalf("one chunk of %d bytes kept %d, want %d", len(huge), n, store.MaxOutputChunk)
	}
	if n := appendOut(other.ID, 2, []byte("more")); int64(n) != max(0, sessionv1.DefaultOutputLimitBytes-store.MaxOutputChunk) {
		t.Fatalf("past the default limit kept %d bytes", n)
	}

	// Pages: 3 MiB in 48 chunks of 64 KiB (an exec allowing it) read back
	// in pages of at most 1 MiB, in order, each following the last.
	big := enqueue(sessionv1.KindExec, `{"exec":{"argv":["yes"],"outputLimitBytes":"4194304"}}`)
	var want []byte
	for i := range 48 {
		part := bytes.Repeat([]byte{byte('a' + i%26)}, 64<<10)
		want = append(want, part...)
		appendOut(big.ID, int64(i+1), part)
	}
	var got []byte
	after, pages := int64(0), 0
	for {
		page := must(h.Store.CommandOutputPage(ctx, &store.CommandOutputPageParams{CommandID: big.ID, AfterSeq: after}))
		pages++
		n := 0
		for _, c := range page.Chunks {
			n += len(c.Data)
			got = append(got, c.Data...)
			after = c.Seq
		}
		if n > store.MaxOutputPage || len(page.Chunks) == 0 {
			t.Fatalf("page %d: %d bytes in %d chunks (at most %d, at least one chunk)", pages, n, len(page.Chunks), store.MaxOutputPage)
		}
		if !page.More {
			break
		}
		if pages > 10 {
			t.Fatal("pages never end")
		}
	}
	if pages != 3 || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes in %d pages, want %d in 3", len(got), pages, len(want))
	}
	// A smaller page than the next chunk still returns that chunk.
	if page := must(h.Store.CommandOutputPage(ctx, &store.CommandOutputPageParams{CommandID: big.ID, MaxBytes: 10})); len(page.Chunks) != 1 || !page.More {
		t.Fatalf("a 10-byte page: %d chunks, more %v; want the first chunk and more", len(page.Chunks), page.More)
	}
	// Past the end: empty, no more.
	if page := must(h.Store.CommandOutputPage(ctx, &store.CommandOutputPageParams{CommandID: big.ID, AfterSeq: after})); len(page.Chunks) != 0 || page.More {
		t.Fatalf("after the last chunk: %d chunks, more %v", len(page.Chunks), page.More)
	}
}
