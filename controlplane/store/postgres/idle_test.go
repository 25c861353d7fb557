package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
)

// TestIdleInTransactionTimeout checks that every transaction of the store
// runs with idle_in_transaction_session_timeout at IdleInTransactionTimeout,
// set with SET LOCAL rather than as a startup parameter, so that it also
// holds through PgBouncer in transaction mode (which refuses the startup
// parameter); a URL that sets the parameter gives the value, through
// PgBouncer too, and a malformed one is refused.
func TestIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T) (storeURL, directURL, want string){
		"direct": func(t *testing.T) (string, string, string) {
			u := pgtest.URL(t)
			return u, u, "5s"
		},
		"url sets it": func(t *testing.T) (string, string, string) {
			u := pgtest.URL(t)
			return u + "&idle_in_transaction_session_timeout=1234", u, "1234ms"
		},
		"pgbouncer": func(t *testing.T) (string, string, string) {
			direct, bouncer := pgtest.Database(t)
			return bouncer, direct, "5s"
		},
		"pgbouncer, url sets it": func(t *testing.T) (string, string, string) {
			direct, bouncer := pgtest.Database(t)
			return bouncer + "&idle_in_transaction_session_timeout=7s", direct, "7s"
		},
	}
	if _, err := postgres.Open(context.Background(), pgtest.URL(t)+"&idle_in_transaction_session_timeout=5s';DROP"); err == nil ||
		!strings.Contains(err.Error(), "idle_in_transaction_session_timeout") {
		t.Errorf("open with a malformed timeout: %v, want an error naming the parameter", err)
	}
	for name, urls := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			storeURL, directURL, want := urls(t)
			s, err := postgres.Open(ctx, storeURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if _, err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if err := pgtest.Exec(directURL)(ctx, `CREATE TABLE seen (site text, timeout text);
CREATE FUNCTION record_timeout() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO seen VALUES (NEW.name, current_setting('idle_in_transaction_session_timeout'));
    RETURN NULL;
END $$;
CREATE TRIGGER record_timeout AFTER INSERT ON sites FOR EACH ROW EXECUTE FUNCTION record_timeout();`); err != nil {
				t.Fatal(err)
			}
			if err := s.Tx(ctx, func(tx store.Store) error {
				_, err := tx.SiteCreate(ctx, &store.SiteCreateParams{Name: "in-tx", Region: "r"})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, directURL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var got string
			if err := conn.QueryRow(ctx, `SELECT timeout FROM seen WHERE site = 'in-tx'`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("idle_in_transaction_session_timeout inside a transaction = %q, want %q", got, want)
			}
		})
	}
}
