package soak

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store/postgres"
)

// writeLogDDL is the soak's write log: a table, soak_writes, and triggers
// that record, with the writer's application_name, the database's clock
// and the fence its transaction carried (postgres.FenceTagSetting, set by
// processes started with postgres.EnvFenceTag; NULL outside fenced
// transactions):
//
//   - kind lease: every insert and deletion of a lease and every change of
//     its holder or epoch (renewals that change neither are left out), as
//     "holder@epoch";
//   - kind state: every command inserted or deleted and every change of
//     its state;
//   - kind fenced: every row any fenced transaction inserts, updates or
//     deletes, in every table of the schema.
//
// Its ids are taken at each write, inside the writing transaction. A fenced
// transaction holds its lease row FOR SHARE from its fence check to its
// commit, so a takeover of that lease, and its lease row here, comes after
// every row the transaction wrote: a fenced row after its lease's move to
// another holder or epoch is a write that fencing let through.
var writeLogDDL = `
CREATE TABLE soak_writes (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    app     text NOT NULL DEFAULT current_setting('application_name'),
    fence   text DEFAULT nullif(current_setting('` + postgres.FenceTagSetting + `', true), ''),
    kind    text NOT NULL,
    tbl     text NOT NULL,
    op      text NOT NULL,
    key     text,
    old_val text,
    new_val text
);
CREATE INDEX soak_writes_lease_idx ON soak_writes (key, id) WHERE kind = 'lease';
CREATE INDEX soak_writes_state_idx ON soak_writes (key, id) WHERE kind = 'state';
CREATE FUNCTION soak_record() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    o jsonb;
    n jsonb;
    r jsonb;
    k text;
BEGIN
    IF TG_OP <> 'INSERT' THEN o := to_jsonb(OLD); END IF;
    IF TG_OP <> 'DELETE' THEN n := to_jsonb(NEW); END IF;
    r := coalesce(n, o);
    IF TG_ARGV[1] = '*' THEN
        k := coalesce(r->>'id', r->>'name', r->>'node_id', r->>'sink');
    ELSE
        k := r->>TG_ARGV[1];
    END IF;
    INSERT INTO soak_writes (kind, tbl, op, key, old_val, new_val)
    VALUES (TG_ARGV[0], TG_TABLE_NAME, TG_OP, k,
        CASE WHEN TG_ARGV[2] = 'holder@epoch' THEN (o->>'holder') || '@' || (o->>'epoch') ELSE o->>TG_ARGV[2] END,
        CASE WHEN TG_ARGV[2] = 'holder@epoch' THEN (n->>'holder') || '@' || (n->>'epoch') ELSE n->>TG_ARGV[2] END);
    RETURN NULL;
END $$;
DO $$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename <> 'soak_writes' LOOP
        EXECUTE format('CREATE TRIGGER soak_fenced AFTER INSERT OR UPDATE OR DELETE ON %I FOR EACH ROW '
            'WHEN (coalesce(current_setting(%L, true), '''') <> '''') EXECUTE FUNCTION soak_record(''fenced'', ''*'', '''')',
            t, '` + postgres.FenceTagSetting + `');
    END LOOP;
END $$;
CREATE TRIGGER soak_leases AFTER INSERT OR DELETE ON leases
    FOR EACH ROW EXECUTE FUNCTION soak_record('lease', 'name', 'holder@epoch');
CREATE TRIGGER soak_leases_moved AFTER UPDATE ON leases
    FOR EACH ROW WHEN (OLD.holder IS DISTINCT FROM NEW.holder OR OLD.epoch IS DISTINCT FROM NEW.epoch)
    EXECUTE FUNCTION soak_record('lease', 'name', 'holder@epoch');
CREATE TRIGGER soak_commands AFTER INSERT OR DELETE ON commands
    FOR EACH ROW EXECUTE FUNCTION soak_record('state', 'id', 'state');
CREATE TRIGGER soak_commands_state AFTER UPDATE ON commands
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION soak_record('state', 'id', 'state');
`

// installWriteLog installs writeLogDDL in the migrated schema at url.
func installWriteLog(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, writeLogDDL); err != nil {
		t.Fatalf("install the write log: %v", err)
	}
}

// staleWrite is a fenced row of the write log whose lease had, by the
// log's order, already passed to another holder or epoch.
type staleWrite struct {
	ID       int64
	At       time.Time
	App      string
	Fence    string // "<lease> <holder> <epoch>" it was written under
	Table    string
	Op       string
	Key      string
	LeaseNow string // the lease's holder@epoch by then, "" if none
}

// querier is what pgxpool.Pool and pgx.Tx share for the checks.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// staleWrites returns (up to limit of) the fenced rows written under a
// lease that had passed, and how many there are in all.
func staleWrites(ctx context.Context, q querier, limit int) ([]staleWrite, int, error) {
	const violations = `
WITH v AS (
    SELECT w.id, w.at, w.app, w.fence, w.tbl, w.op, coalesce(w.key, '') AS key, coalesce(l.new_val, '') AS lease_now
    FROM soak_writes w
    LEFT JOIN LATERAL (
        SELECT new_val FROM soak_writes l
        WHERE l.kind = 'lease' AND l.key = split_part(w.fence, ' ', 1) AND l.id < w.id
        ORDER BY l.id DESC LIMIT 1) l ON true
    WHERE w.kind = 'fenced'
      AND l.new_val IS DISTINCT FROM split_part(w.fence, ' ', 2) || '@' || split_part(w.fence, ' ', 3))
SELECT id, at, app, fence, tbl, op, key, lease_now, count(*) OVER () FROM v ORDER BY id LIMIT $1`
	rows, err := q.Query(ctx, violations, limit)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []staleWrite
	total := 0
	for rows.Next() {
		var w staleWrite
		if err := rows.Scan(&w.ID, &w.At, &w.App, &w.Fence, &w.Table, &w.Op, &w.Key, &w.LeaseNow, &total); err != nil {
			return nil, 0, err
		}
		out = append(out, w)
	}
	return out, total, rows.Err()
}

// commandLog is the write log's record of one command: its transitions
// into a terminal state and out of one.
type commandLog struct {
	into, outOf int
}

// commandTransitions reads the state log of every command.
func commandTransitions(ctx context.Context, q querier, terminal func(string) bool) (map[string]*commandLog, error) {
	rows, err := q.Query(ctx, `SELECT key, old_val, new_val FROM soak_writes WHERE kind = 'state' AND tbl = 'commands' ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*commandLog{}
	for rows.Next() {
		var key string
		var oldVal, newVal *string
		if err := rows.Scan(&key, &oldVal, &newVal); err != nil {
			return nil, err
		}
		c := out[key]
		if c == nil {
			c = &commandLog{}
			out[key] = c
		}
		wasTerminal := oldVal != nil && terminal(*oldVal)
		isTerminal := newVal != nil && terminal(*newVal)
		if isTerminal && !wasTerminal {
			c.into++
		}
		if wasTerminal {
			c.outOf++
		}
	}
	return out, rows.Err()
}
