package doctor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/store"
)

// failingDeadLetters is a store whose DeadLetterCounts fails.
type failingDeadLetters struct{}

func (failingDeadLetters) DeadLetterCounts(context.Context) (map[string]int64, error) {
	return nil, errors.New("database is gone")
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	want(t, doctor.DeadLetters(context.Background(), failingDeadLetters{}), doctor.IDDeadLetters, doctor.Fail, "database is gone")
	each(t, func(t *testing.T, st rawStore) {
		ctx := context.Background()
		want(t, doctor.DeadLetters(ctx, st), doctor.IDDeadLetters, doctor.OK, "no sink has given up")
		dead := func(sink string, n int) {
			t.Helper()
			for range n {
				id, err := st.OutboxInsert(ctx, "com.better-compute.node.ready", "node_a", []byte(`{}`))
				if err != nil {
					t.Fatal(err)
				}
				if err := st.DeadLetterInsert(ctx, &store.DeadLetter{Sink: sink, Entry: store.OutboxEntry{ID: id,
					Topic: "com.better-compute.node.ready", Key: "node_a", Payload: []byte(`{}`), CreatedAt: time.Now()},
					Attempts: 10, LastError: "503"}); err != nil {
					t.Fatal(err)
				}
			}
		}

		// One sink: the hint names it in the replay command.
		dead("alerts", 2)
		r := doctor.DeadLetters(ctx, st)
		want(t, r, doctor.IDDeadLetters, doctor.Warn, "2 event(s) a sink gave up on")
		if !strings.Contains(r.Hint, "better-compute sinks replay --all --sink alerts") || r.Detail != "alerts: 2" {
			t.Fatalf("one sink: hint %q, detail %q", r.Hint, r.Detail)
		}

		// Two: counted per sink, in name order.
		dead("archive", 1)
		r = doctor.DeadLetters(ctx, st)
		want(t, r, doctor.IDDeadLetters, doctor.Warn, "3 event(s)")
		if !strings.Contains(r.Hint, "--sink SINK") || r.Detail != "alerts: 2, archive: 1" {
			t.Fatalf("two sinks: hint %q, detail %q", r.Hint, r.Detail)
		}

		// Run reports it after the sweeper; a warning, not a failure.
		rep := doctor.Run(ctx, st, doctor.Config{Secret: secret})
		for i, c := range rep.Checks {
			if c.ID == doctor.IDDeadLetters {
				if i == 0 || rep.Checks[i-1].ID != doctor.IDSweeper || c.Status != doctor.Warn {
					t.Fatalf("checks = %+v", rep.Checks)
				}
				return
			}
		}
		t.Fatalf("Run has no %s: %+v", doctor.IDDeadLetters, rep.Checks)
	})
}
