package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
)

// TestFenceTag checks that with EnvFenceTag set every fenced transaction
// carries its fence in FenceTagSetting, where a trigger sees it, and that a
// plain transaction carries none.
func TestFenceTag(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	t.Setenv(postgres.EnvFenceTag, "1")
	s, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Exec(url)(ctx, `CREATE TABLE seen (site text, fence text);
CREATE FUNCTION record_fence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO seen VALUES (NEW.name, current_setting('`+postgres.FenceTagSetting+`', true));
    RETURN NULL;
END $$;
CREATE TRIGGER record_fence AFTER INSERT ON sites FOR EACH ROW EXECUTE FUNCTION record_fence();`); err != nil {
		t.Fatal(err)
	}
	l, ok, err := s.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "singleton:test", Holder: "w1", TTL: time.Minute})
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if err := s.FencedTx(ctx, store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}, func(tx store.Store) error {
		_, err := tx.SiteCreate(ctx, &store.SiteCreateParams{Name: "fenced", Region: "r"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SiteCreate(ctx, &store.SiteCreateParams{Name: "plain", Region: "r"}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	got := map[string]string{}
	rows, err := conn.Query(ctx, `SELECT site, coalesce(fence, '') FROM seen`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var site, fence string
		if err := rows.Scan(&site, &fence); err != nil {
			t.Fatal(err)
		}
		got[site] = fence
	}
	rows.Close()
	want := map[string]string{"fenced": "singleton:test w1 1", "plain": ""}
	if len(got) != 2 || got["fenced"] != want["fenced"] || got["plain"] != want["plain"] {
		t.Fatalf("fences seen by the trigger: %q, want %q", got, want)
	}
}
