package workers

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestRetainPrunesHistory: the retention job prunes what closed before its
// window (a reservation cancelled in 2001), keeps what is open, and logs
// the counts by kind; shell recordings go by their start
// (retention.recordings), with their chunks.
func TestRetainPrunesHistory(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	reserve := func() *store.Reservation {
		r, err := st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 1, Start: time.Now().Add(time.Hour),
			End: time.Now().Add(2 * time.Hour), Owner: "team", Now: &old})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	closed, open := reserve(), reserve()
	if _, err := st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: closed.ID, Now: &old}); err != nil {
		t.Fatal(err)
	}
	recent := time.Now()
	for id, at := range map[string]*time.Time{"rec_old": &old, "rec_new": &recent} {
		if _, err := st.RecordingCreate(ctx, &store.RecordingCreateParams{ID: id, NodeID: "n", Now: at}); err != nil {
			t.Fatal(err)
		}
		if err := st.RecordingChunkAdd(ctx, &store.RecordingChunkAddParams{RecordingID: id, Seq: 0, Sealed: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	l, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "singleton:retention", Holder: "w1", TTL: time.Minute})
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	var logs bytes.Buffer
	window := config.Duration{Duration: 720 * time.Hour}
	r := config.Retention{Commands: window, Events: window, Audit: window, History: window, Recordings: window}
	if err := retain(ctx, st, store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}, time.Now(), r, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ReservationGet(ctx, closed.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("reservation closed in 2001: %v, want it pruned", err)
	}
	if _, err := st.ReservationGet(ctx, open.ID); err != nil {
		t.Errorf("open reservation: %v, want it kept", err)
	}
	if _, err := st.RecordingGet(ctx, "rec_old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("recording of 2001: %v, want it pruned", err)
	}
	if chunks, err := st.RecordingChunks(ctx, &store.RecordingChunksParams{RecordingID: "rec_old", After: -1}); err != nil || len(chunks) != 0 {
		t.Errorf("chunks of the pruned recording: %d, %v; want none", len(chunks), err)
	}
	if _, err := st.RecordingGet(ctx, "rec_new"); err != nil {
		t.Errorf("recent recording: %v, want it kept", err)
	}
	if !strings.Contains(logs.String(), "recordings=1") {
		t.Errorf("log %q, want recordings=1", logs.String())
	}
	if !strings.Contains(logs.String(), "reservations=1") || !strings.Contains(logs.String(), "rollouts=0") {
		t.Errorf("log %q, want the counts by kind", logs.String())
	}
}
