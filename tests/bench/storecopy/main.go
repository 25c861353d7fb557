// Command storecopy measures better-compute store copy: how long
// transfer.Copy takes to move an embedded database of N nodes and M events
// into an empty PostgreSQL schema (migrations, the copy in batches of COPY,
// and the verification that reads every table back and checksums it), and
// the rows per second that makes.
//
//	go run ./tests/bench/storecopy -nodes 10000 -events 1000000
//	go run ./tests/bench/storecopy -nodes 1000 -events 50000   # a quick run
//
// The source is made in a temporary directory: a migrated SQLite database
// with one site and pool, N nodes (labels, a certificate serial, a session
// each) and M events of about 200 bytes of JSON payload spread over them,
// written with plain SQL in one transaction. The target is a fresh schema
// on -db, dropped at the end. Nothing is asserted; it prints.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/store/transfer"
)

func main() {
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped)")
	nodes := flag.Int("nodes", 10000, "nodes in the source")
	events := flag.Int("events", 1000000, "events in the source")
	batch := flag.Int("batch", transfer.DefaultBatchRows, "rows per COPY")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the copy to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer f.Close()
		cpuProfileFile = f
	}
	if err := run(context.Background(), *db, *nodes, *events, *batch); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// cpuProfileFile receives the copy's CPU profile (-cpuprofile).
var cpuProfileFile *os.File

func run(ctx context.Context, server string, nodes, events, batch int) error {
	dir, err := os.MkdirTemp("", "storecopy-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "state.db")
	start := time.Now()
	if err := fill(ctx, src, nodes, events); err != nil {
		return fmt.Errorf("fill the source: %w", err)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	fmt.Printf("source: %d nodes, %d events, %.0f MiB of SQLite, made in %.1f s\n", nodes, events, float64(fi.Size())/(1<<20), time.Since(start).Seconds())

	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	sep := "?"
	if strings.Contains(server, "?") {
		sep = "&"
	}
	if cpuProfileFile != nil {
		if err := pprof.StartCPUProfile(cpuProfileFile); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := transfer.Copy(ctx, transfer.Config{Source: src, Target: server + sep + "search_path=" + schema, BatchRows: batch})
	if err != nil {
		return err
	}
	fmt.Printf("store copy: %d rows in %d tables in %.1f s (%.0f rows/s), migrations, copy and verification included\n",
		res.Rows, len(res.Tables), res.Elapsed.Seconds(), float64(res.Rows)/res.Elapsed.Seconds())
	fmt.Printf("  copying %.1f s (%.0f rows/s), verifying %.1f s (%.0f rows/s), the rest (checks, migrations, commit) %.1f s\n",
		res.Copying.Seconds(), float64(res.Rows)/res.Copying.Seconds(), res.Verifying.Seconds(), float64(res.Rows)/res.Verifying.Seconds(),
		(res.Elapsed - res.Copying - res.Verifying).Seconds())
	for _, t := range res.Tables {
		if t.Rows > 0 {
			fmt.Printf("  %-18s %9d rows  %s\n", t.Name, t.Rows, t.Checksum.String()[:16])
		}
	}
	return nil
}

// fill makes the source database.
func fill(ctx context.Context, path string, nodes, events int) error {
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		return err
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		return err
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "r"})
	if err != nil {
		st.Close()
		return err
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "bench", SiteID: site.ID})
	st.Close()
	if err != nil {
		return err
	}
	db, err := sqlite.OpenDB(ctx, path)
	if err != nil {
		return err
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	now := time.Now().UnixMicro()
	node, err := tx.PrepareContext(ctx, `INSERT INTO nodes (id, pool_id, hostname, machine_id, state, labels, bcd_version, os, arch,
		cert_serial, cert_not_after, created_at, updated_at, last_seen_at, shard, key_sha256, join_token_id)
		VALUES ($1, $2, $3, $4, 'ready', $5, '1.0.0', 'linux', 'amd64', $6, $7, $8, $8, $8, $9, $10, 'jt_bench')`)
	if err != nil {
		return err
	}
	sess, err := tx.PrepareContext(ctx, `INSERT INTO sessions (node_id, session_id, gateway_id, epoch, remote_addr, connected_at, last_heartbeat_at)
		VALUES ($1, $2, 'gw_bench', 1, '10.0.0.1:40000', $3, $3)`)
	if err != nil {
		return err
	}
	for i := range nodes {
		id := fmt.Sprintf("node_bench%08d", i)
		if _, err := node.ExecContext(ctx, id, pool.ID, fmt.Sprintf("gpu-%05d", i), fmt.Sprintf("%032x", i),
			fmt.Sprintf(`{"rack":"r%d","gpu":"h100","zone":"z%d"}`, i%40, i%3), fmt.Sprintf("%040x", i), now+365*24*3600e6, now, i%256,
			fmt.Sprintf("%064x", i)); err != nil {
			return err
		}
		if _, err := sess.ExecContext(ctx, id, fmt.Sprintf("sess_bench%08d", i), now); err != nil {
			return err
		}
	}
	ev, err := tx.PrepareContext(ctx, `INSERT INTO events (node_id, kind, severity, message, time, payload) VALUES ($1, $2, 'info', $3, $4, $5)`)
	if err != nil {
		return err
	}
	for i := range events {
		n := i % max(nodes, 1)
		if _, err := ev.ExecContext(ctx, fmt.Sprintf("node_bench%08d", n), "gpu.health", "GPU 3 temperature 71 C",
			now-int64(events-i)*1000,
			fmt.Sprintf(`{"gpu":3,"uuid":"GPU-%08d-0000-0000-0000-000000000003","temperatureC":71,"powerW":412.5,"xid":0,"seq":%d}`, n, i)); err != nil {
			return err
		}
	}
	return tx.Commit()
}
