package doctor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Clock skew limits between the database and this machine.
const (
	ClockWarn = 2 * time.Second
	ClockFail = 30 * time.Second
)

// Schema checks the schema against this build: pending expand migrations
// fail (serve --no-migrate refuses to start), pending contract ones only
// warn (they wait for older builds to stop; issue 40), and so do applied migrations this
// build does not know (a newer build migrated the database). migrated
// reports whether the tables the other checks read are in place.
func Schema(ctx context.Context, st store.Migrator) (res Result, migrated bool) {
	status, err := st.MigrationStatus(ctx)
	var me *store.MigrationError
	switch {
	case errors.As(err, &me):
		return result(IDSchema, Fail, "the database was migrated by a newer build: run that build (or newer) of better-compute",
			"unknown migrations: "+strings.Join(me.Unknown, ", ")), true
	case err != nil:
		return result(IDSchema, Fail, "cannot read the schema: "+err.Error()), false
	case len(status.PendingExpand()) > 0:
		return result(IDSchema, Fail, fmt.Sprintf("%d pending migration(s): run better-compute migrate", len(status.Pending)),
			"pending: "+strings.Join(status.Pending, ", "), "the other database checks were skipped"), false
	case len(status.PendingContract) > 0:
		return result(IDSchema, Warn, fmt.Sprintf("%d pending contract migration(s): run better-compute migrate once no older build runs (docs/upgrade-control-plane.md)", len(status.PendingContract)),
			"pending: "+strings.Join(status.PendingContract, ", ")), true
	}
	return result(IDSchema, OK, fmt.Sprintf("schema is current (%d migrations)", len(status.Applied))), true
}

// Clock compares the database's clock with local (this machine's), taking
// the midpoint of the query's round trip as the moment the database read its
// clock. Beyond ClockWarn it warns, beyond ClockFail it fails: leases,
// deadlines and heartbeats are judged by the database's clock, while this
// machine's clock stamps what it writes and logs. It also returns the
// database's time (the local time when the database cannot be read), the
// reference the other checks compare stored times with.
func Clock(ctx context.Context, st interface {
	Now(context.Context) (time.Time, error)
	Dialect() store.Dialect
}, local func() time.Time) (Result, time.Time) {
	t0 := local()
	db, err := st.Now(ctx)
	t1 := local()
	if err != nil {
		return result(IDClock, Fail, "cannot read the database clock: "+err.Error()), t0
	}
	rtt := t1.Sub(t0)
	mid := t0.Add(rtt / 2)
	skew := db.Sub(mid)
	abs := skew.Abs()
	detail := fmt.Sprintf("database %s, local %s, skew %s (round trip %s)", db.Format(time.RFC3339Nano),
		mid.UTC().Format(time.RFC3339Nano), skew.Round(time.Millisecond), rtt.Round(time.Microsecond))
	// The database time is only known within half the round trip.
	abs -= rtt / 2
	ahead := "ahead of"
	if skew < 0 {
		ahead = "behind"
	}
	switch {
	case abs > ClockFail:
		return result(IDClock, Fail, fmt.Sprintf("the database clock is %s %s this machine's: synchronise both with NTP", skew.Abs().Round(time.Second), ahead), detail), db
	case abs > ClockWarn:
		return result(IDClock, Warn, fmt.Sprintf("the database clock is %s %s this machine's: check NTP on both", skew.Abs().Round(time.Millisecond), ahead), detail), db
	}
	hint := "database and local clocks agree"
	if st.Dialect() == store.DialectSQLite {
		hint = "embedded SQLite reads this machine's clock"
	}
	return result(IDClock, OK, hint, detail), db
}
