package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TestTranslateUnavailable: what a failover or a restart gives — a server
// shutting down, a standby refusing a write, a connection refused — is
// store.ErrUnavailable with the driver's error kept; a caller's mistake or a
// deadline is not.
func TestTranslateUnavailable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Nothing listens on port 1: a real refused connection.
	_, connErr := pgconn.Connect(ctx, "postgres://postgres@127.0.0.1:1/test?connect_timeout=2")
	if connErr == nil {
		t.Fatal("a connection to port 1 succeeded")
	}
	shutdown := &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"refused":       {connErr, true},
		"admin stop":    {fmt.Errorf("commit: %w", shutdown), true},
		"standby":       {&pgconn.PgError{Code: "25006", Message: "cannot execute UPDATE in a read-only transaction"}, true},
		"link gone":     {&pgconn.PgError{Code: "08006", Message: "connection failure"}, true},
		"unique":        {&pgconn.PgError{Code: "23505", Message: "duplicate key"}, false},
		"syntax":        {&pgconn.PgError{Code: "42601", Message: "syntax error"}, false},
		"deadline":      {context.DeadlineExceeded, false},
		"cancelled":     {context.Canceled, false},
		"anything else": {errors.New("boom"), false},
	} {
		got := translate(tc.err)
		if errors.Is(got, store.ErrUnavailable) != tc.want {
			t.Errorf("%s: translate(%v) = %v, unavailable %v", name, tc.err, got, !tc.want)
		}
		if tc.want && !errors.Is(got, tc.err) {
			t.Errorf("%s: the driver's error is lost: %v", name, got)
		}
	}
}
