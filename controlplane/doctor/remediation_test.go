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

type failingBreakers struct{}

func (failingBreakers) RemediationBreakers(context.Context) ([]*store.RemediationBreaker, error) {
	return nil, errors.New("database is gone")
}

// TestRemediationBreaker: ok with no breaker tripped; fails naming the
// pool and the reset command while one is; ok again after the reset.
func TestRemediationBreaker(t *testing.T) {
	t.Parallel()
	want(t, doctor.RemediationBreaker(context.Background(), failingBreakers{}), doctor.IDRemediationBreaker, doctor.Fail, "database is gone")
	each(t, func(t *testing.T, st rawStore) {
		ctx := context.Background()
		want(t, doctor.RemediationBreaker(ctx, st), doctor.IDRemediationBreaker, doctor.OK, "no pool's remediation breaker")
		site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpus", SiteID: site.ID})
		if err != nil {
			t.Fatal(err)
		}
		// A breaker of one quarantine an hour with one already: the next trips it.
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_q", PoolID: pool.ID, Hostname: "q", MachineID: "q"}); err != nil {
			t.Fatal(err)
		}
		c, err := st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_q", State: store.RemediationDetected, Finding: "xid", Action: "reboot"}, "t")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationQuarantined, Actor: "t"}); err != nil {
			t.Fatal(err)
		}
		if _, tripped, err := st.RemediationBreakerAdmit(ctx, &store.RemediationBreakerAdmitParams{PoolID: pool.ID, Limit: 1, Window: time.Hour}); err != nil || !tripped {
			t.Fatalf("tripped %v, %v", tripped, err)
		}
		r := doctor.RemediationBreaker(ctx, st)
		want(t, r, doctor.IDRemediationBreaker, doctor.Fail, "tripped")
		if !strings.Contains(r.Hint, "better-compute remediation reset-breaker "+pool.ID) || !strings.HasPrefix(r.Detail, pool.ID+" since ") {
			t.Fatalf("hint %q, detail %q", r.Hint, r.Detail)
		}
		rep := doctor.Run(ctx, st, doctor.Config{Secret: secret})
		found := false
		for _, ch := range rep.Checks {
			found = found || (ch.ID == doctor.IDRemediationBreaker && ch.Status == doctor.Fail)
		}
		if !found || rep.Status != doctor.Fail {
			t.Fatalf("Run: %+v", rep.Checks)
		}
		if _, err := st.RemediationBreakerReset(ctx, pool.ID, "token:op", nil); err != nil {
			t.Fatal(err)
		}
		want(t, doctor.RemediationBreaker(ctx, st), doctor.IDRemediationBreaker, doctor.OK, "no pool's")
	})
}
