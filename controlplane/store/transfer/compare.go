package transfer

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

// Comparison is one table counted and checksummed in a source and a target.
type Comparison struct {
	Name                           string
	SourceRows, TargetRows         int64
	SourceChecksum, TargetChecksum Checksum
}

// Equal reports whether the table's rows are the same on both sides.
func (c Comparison) Equal() bool {
	return c.SourceRows == c.TargetRows && c.SourceChecksum == c.TargetChecksum
}

// Compare counts and checksums every table of the embedded database source
// and of the (migrated) PostgreSQL database target, each read on its own:
// what Copy verified before it committed, read again afterwards.
func Compare(ctx context.Context, source, target string) ([]Comparison, error) {
	lite, err := sqlite.OpenDB(ctx, source)
	if err != nil {
		return nil, err
	}
	defer lite.Close()
	pgCfg, _, err := postgres.ParseURL(target)
	if err != nil {
		return nil, err
	}
	pg, err := pgx.ConnectConfig(ctx, pgCfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connect to the target: %w", err)
	}
	defer pg.Close(context.WithoutCancel(ctx))
	plan, err := makePlan(ctx, lite, pg)
	if err != nil {
		return nil, err
	}
	src, err := lite.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer src.Rollback()
	tx, err := pg.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var out []Comparison
	for _, t := range plan {
		c := Comparison{Name: t.name}
		if c.SourceRows, c.SourceChecksum, err = sourceSum(ctx, src, t); err != nil {
			return nil, fmt.Errorf("checksum the source's %s: %w", t.name, err)
		}
		if c.TargetRows, c.TargetChecksum, err = targetSum(ctx, tx, t); err != nil {
			return nil, fmt.Errorf("checksum the target's %s: %w", t.name, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// sourceSum counts and checksums t in the source.
func sourceSum(ctx context.Context, src *sql.Tx, t *table) (int64, Checksum, error) {
	var sum Checksum
	rows, err := src.QueryContext(ctx, `SELECT `+t.quoted("")+` FROM "`+t.name+`"`)
	if err != nil {
		return 0, sum, err
	}
	defer rows.Close()
	raw := make([]any, len(t.columns))
	ptrs := make([]any, len(t.columns))
	for i := range raw {
		ptrs[i] = &raw[i]
	}
	var n int64
	var buf []byte
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return 0, sum, err
		}
		buf = buf[:0]
		for i, c := range t.columns {
			v, err := c.fromSQLite(raw[i])
			if err != nil {
				return 0, sum, err
			}
			if buf, err = c.canonical(buf, v); err != nil {
				return 0, sum, err
			}
		}
		sum.add(buf)
		n++
	}
	return n, sum, rows.Err()
}
