package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testRecordings: a recording's chunks are stored in order and counted
// with it, a chunk number is stored once, reads page by count and bytes,
// the end is recorded once (a failure never turns into a completion), the
// list is newest first with a node filter and a cursor, and pruning takes
// the old recordings with their chunks.
func testRecordings(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	now := time.Now().UTC().Truncate(time.Millisecond)
	create := func(id, node string, at time.Time) {
		rec := must(st.RecordingCreate(ctx, &store.RecordingCreateParams{ID: id, TunnelID: "tun_" + id, NodeID: node,
			CreatedBy: "token:tok_1", AsRoot: id == "rec_1", Now: &at}))
		if rec.State != store.RecordingRecording || !rec.StartedAt.Equal(at) || rec.EndedAt != nil || rec.AsRoot != (id == "rec_1") {
			t.Fatalf("created recording = %+v", rec)
		}
	}
	create("rec_1", "node_a", now.Add(-3*time.Hour))
	create("rec_2", "node_b", now.Add(-2*time.Hour))
	create("rec_3", "node_a", now.Add(-time.Hour))
	_, err := st.RecordingCreate(ctx, &store.RecordingCreateParams{ID: "rec_1", NodeID: "node_a", Now: &now})
	wantErr(t, err, store.ErrConflict)

	for seq := range 3 {
		check(t, st.RecordingChunkAdd(ctx, &store.RecordingChunkAddParams{RecordingID: "rec_1", Seq: seq,
			Sealed: []byte{byte(seq), 1, 2, 3, 4, 5, 6, 7, 8, 9}, Bytes: 100}))
	}
	wantErr(t, st.RecordingChunkAdd(ctx, &store.RecordingChunkAddParams{RecordingID: "rec_1", Seq: 1, Sealed: []byte("x"), Bytes: 1}), store.ErrConflict)
	wantErr(t, st.RecordingChunkAdd(ctx, &store.RecordingChunkAddParams{RecordingID: "rec_none", Seq: 0, Sealed: []byte("x")}), store.ErrNotFound)
	rec := must(st.RecordingGet(ctx, "rec_1"))
	if rec.Bytes != 300 || rec.Chunks != 3 {
		t.Fatalf("recording after 3 chunks (and a refused duplicate) = %+v, want 300 bytes in 3 chunks", rec)
	}
	chunks := must(st.RecordingChunks(ctx, &store.RecordingChunksParams{RecordingID: "rec_1", After: -1, Limit: 10}))
	if len(chunks) != 3 || chunks[0].Seq != 0 || chunks[2].Seq != 2 || chunks[1].Sealed[0] != 1 {
		t.Fatalf("chunks = %+v", chunks)
	}
	if got := must(st.RecordingChunks(ctx, &store.RecordingChunksParams{RecordingID: "rec_1", After: 0, Limit: 10, MaxBytes: 15})); len(got) != 1 || got[0].Seq != 1 {
		t.Fatalf("chunks after 0 within 15 bytes = %+v, want chunk 1 alone", got)
	}
	if got := must(st.RecordingChunks(ctx, &store.RecordingChunksParams{RecordingID: "rec_1", After: -1, Limit: 10, MaxBytes: 1})); len(got) != 1 {
		t.Fatalf("chunks within 1 byte = %d, want the first one all the same", len(got))
	}
	if got := must(st.RecordingChunks(ctx, &store.RecordingChunksParams{RecordingID: "rec_1", After: 2, Limit: 10})); len(got) != 0 {
		t.Fatalf("chunks after the last = %+v", got)
	}

	end := now.Add(-150 * time.Minute)
	check(t, st.RecordingEnd(ctx, &store.RecordingEndParams{ID: "rec_1", State: store.RecordingComplete, Reason: "exit", Now: &end}))
	check(t, st.RecordingEnd(ctx, &store.RecordingEndParams{ID: "rec_1", State: store.RecordingFailed, Reason: "late", Now: &now}))
	rec = must(st.RecordingGet(ctx, "rec_1"))
	if rec.State != store.RecordingComplete || rec.Reason != "exit" || rec.EndedAt == nil || !rec.EndedAt.Equal(end) {
		t.Fatalf("ended recording = %+v", rec)
	}
	check(t, st.RecordingEnd(ctx, &store.RecordingEndParams{ID: "rec_2", State: store.RecordingFailed, Reason: "database down", Now: &now}))
	check(t, st.RecordingEnd(ctx, &store.RecordingEndParams{ID: "rec_2", State: store.RecordingComplete, Reason: "exit", Now: &now}))
	if rec := must(st.RecordingGet(ctx, "rec_2")); rec.State != store.RecordingFailed || rec.Reason != "database down" {
		t.Fatalf("failed recording after a later completion = %+v, want failed", rec)
	}
	_, err = st.RecordingGet(ctx, "rec_none")
	wantErr(t, err, store.ErrNotFound)

	ids := func(p *store.RecordingListParams) []string {
		var out []string
		for _, r := range must(st.RecordingList(ctx, p)) {
			out = append(out, r.ID)
		}
		return out
	}
	if got := ids(&store.RecordingListParams{}); len(got) != 3 || got[0] != "rec_3" || got[2] != "rec_1" {
		t.Fatalf("list = %v, want newest first", got)
	}
	if got := ids(&store.RecordingListParams{NodeID: "node_a"}); len(got) != 2 || got[0] != "rec_3" || got[1] != "rec_1" {
		t.Fatalf("list of node_a = %v", got)
	}
	if got := ids(&store.RecordingListParams{ListParams: store.ListParams{Cursor: "rec_3", Limit: 1}}); len(got) != 1 || got[0] != "rec_2" {
		t.Fatalf("list after rec_3, 1 = %v, want rec_2", got)
	}

	if n := must(st.RecordingPrune(ctx, now.Add(-150*time.Minute))); n != 1 {
		t.Fatalf("pruned %d, want 1 (rec_1)", n)
	}
	_, err = st.RecordingGet(ctx, "rec_1")
	wantErr(t, err, store.ErrNotFound)
	if got := must(st.RecordingChunks(ctx, &store.RecordingChunksParams{RecordingID: "rec_1", After: -1})); len(got) != 0 {
		t.Fatalf("chunks of a pruned recording = %d, want none", len(got))
	}
	// rec_3 never ended (its shell is open): retention keeps it while the
	// ended rec_2 goes, and takes it RecordingUnendedGrace later.
	if n := must(st.RecordingPrune(ctx, now)); n != 1 {
		t.Fatalf("pruned %d at now, want 1 (rec_2, ended; not rec_3, still recording)", n)
	}
	must(st.RecordingGet(ctx, "rec_3"))
	if n := must(st.RecordingPrune(ctx, now.Add(store.RecordingUnendedGrace))); n != 1 {
		t.Fatalf("pruned %d a grace later, want 1 (rec_3)", n)
	}
}
