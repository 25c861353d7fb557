// Command placer measures the capacity placer (package placer) and
// capacity.summary at fleet size: N nodes of 8 GPUs split over P pools,
// R reservations (windows over 30 days: 1 to 24 hours; 1, 2, 4 or 8 GPUs,
// one in ten a whole node), created pending, then placed by
// placer.PlacePool pool after pool, as the scheduler role's rounds do
// (each pool's round in one transaction, up to -batch placements a round).
// It prints placements per second, then the latency of placer.Summarize
// (what capacity.summary runs) over one pool and over the whole fleet,
// with the inventory cache warm, at a busy instant, median and worst of
// 20.
//
//	go run ./tests/bench/placer -nodes 10000 -pools 100 -reservations 100000
//	go run ./tests/bench/placer -nodes 10000 -pools 1 -reservations 10000   # one pool of 10,000 nodes
//	go run ./tests/bench/placer -db sqlite
//
// Nothing is asserted; it prints.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/reconcilers/placer"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// fleetTx is what making the bench's site, pools and nodes writes.
type fleetTx interface {
	SiteCreate(ctx context.Context, p *store.SiteCreateParams) (*store.Site, error)
	PoolCreate(ctx context.Context, p *store.PoolCreateParams) (*store.Pool, error)
	NodeUpsert(ctx context.Context, p *store.NodeUpsertParams) (*store.Node, error)
	NodeSetState(ctx context.Context, id, state string) error
	NodeSetInventory(ctx context.Context, id string, inventory []byte, digest string) error
}

func main() {
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped), or \"sqlite\"")
	nodes := flag.Int("nodes", 10000, "nodes (8 GPUs each)")
	pools := flag.Int("pools", 100, "pools the nodes are split over")
	reservations := flag.Int("reservations", 100000, "reservations to place")
	batch := flag.Int("batch", 1000, "placements per pool round (placer.Config.MaxPlacements)")
	flag.Parse()
	if err := run(*db, *nodes, *pools, *reservations, *batch); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(db string, nNodes, nPools, nRes, batch int) error {
	ctx := context.Background()
	st, cleanup, err := openStore(ctx, db)
	if err != nil {
		return err
	}
	defer cleanup()
	t0 := time.Now()
	var poolIDs []string
	inv := inventory()
	err = store.InTx(ctx, st, func(tx fleetTx) error {
		site, err := tx.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "r"})
		if err != nil {
			return err
		}
		for p := range nPools {
			pool, err := tx.PoolCreate(ctx, &store.PoolCreateParams{Name: fmt.Sprintf("pool-%03d", p), SiteID: site.ID})
			if err != nil {
				return err
			}
			poolIDs = append(poolIDs, pool.ID)
		}
		for i := range nNodes {
			id := fmt.Sprintf("node-%05d", i)
			if _, err := tx.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: poolIDs[i%nPools], Hostname: id}); err != nil {
				return err
			}
			if err := tx.NodeSetState(ctx, id, store.NodeReady); err != nil {
				return err
			}
			if err := tx.NodeSetInventory(ctx, id, inv, "bench"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("make nodes: %w", err)
	}
	base := time.Now().Add(time.Hour).Truncate(time.Hour)
	rng := mrand.New(mrand.NewPCG(1, 2))
	for start := 0; start < nRes; start += 5000 {
		err := store.InTx(ctx, st, func(tx store.ReservationStore) error {
			for range min(5000, nRes-start) {
				p := store.ReservationCreateParams{PoolID: poolIDs[rng.IntN(nPools)], Owner: fmt.Sprintf("team-%d", rng.IntN(20))}
				if rng.IntN(10) == 0 {
					p.Nodes = 1
				} else {
					p.GPUs = []int{1, 2, 4, 8}[rng.IntN(4)]
				}
				p.Start = base.Add(time.Duration(rng.IntN(30*24)) * time.Hour)
				p.End = p.Start.Add(time.Duration(1+rng.IntN(24)) * time.Hour)
				if _, err := tx.ReservationCreate(ctx, &p); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("create reservations: %w", err)
		}
	}
	fmt.Printf("setup: %d nodes (%d GPUs) in %d pools, %d pending reservations, %s (%s)\n", nNodes, 8*nNodes, nPools, nRes,
		time.Since(t0).Round(time.Millisecond), st.Dialect())

	pl := placer.New(placer.Config{MaxPlacements: batch}, st, nil)
	var placed, failed, rounds int
	t1 := time.Now()
	for _, pool := range poolIDs {
		for {
			res, err := pl.PlacePool(ctx, st, pool)
			if err != nil {
				return fmt.Errorf("place pool %s: %w", pool, err)
			}
			rounds++
			placed += res.Placed
			failed += res.Failed
			if res.Placed+res.Failed+res.Conflicts == 0 {
				break
			}
		}
	}
	took := time.Since(t1)
	fmt.Printf("placer: %d placed, %d failed (no capacity) in %s over %d pool rounds: %.0f placements/s\n",
		placed, failed, took.Round(time.Millisecond), rounds, float64(placed+failed)/took.Seconds())

	facts := placer.NewFacts()
	at := base.Add(15 * 24 * time.Hour)
	for _, scope := range []struct{ name, pool string }{{"one pool", poolIDs[0]}, {"every pool", ""}} {
		t := time.Now()
		if _, err := placer.Summarize(ctx, st, facts, scope.pool, at, at.Add(time.Microsecond), 0); err != nil {
			return err
		}
		cold := time.Since(t)
		for _, maxAge := range []time.Duration{0, api.SummaryNodesMaxAge} {
			var lat []time.Duration
			var sum *placer.Summary
			for range 20 {
				t := time.Now()
				sum, err = placer.Summarize(ctx, st, facts, scope.pool, at, at.Add(time.Microsecond), maxAge)
				if err != nil {
					return err
				}
				lat = append(lat, time.Since(t))
			}
			slices.Sort(lat)
			m := sum.Models[0]
			fmt.Printf("capacity.summary (%s, %d nodes, nodes read at most %v ago): median %s, worst %s of 20 (first, inventories decoded: %s); %d GPUs: %d reserved, %d free, %d unavailable\n",
				scope.name, sum.Nodes, maxAge, lat[10].Round(time.Microsecond), lat[19].Round(time.Microsecond), cold.Round(time.Microsecond),
				m.Total, m.Reserved, m.Free, m.Unavailable)
		}
	}
	return nil
}

// inventory is a node's inventory of 8 H100s.
func inventory() []byte {
	inv := &sessionv1.Inventory{}
	for g := range 8 {
		inv.Gpus = append(inv.Gpus, &sessionv1.GPU{Index: uint32(g), Name: "NVIDIA H100 80GB HBM3", Uuid: fmt.Sprintf("GPU-%d", g), MemoryTotalBytes: 81559 << 20})
	}
	b, _ := protojson.Marshal(inv)
	return b
}

// openStore opens a migrated store: a fresh PostgreSQL schema, or a fresh
// SQLite file.
func openStore(ctx context.Context, db string) (store.Store, func(), error) {
	if db == "sqlite" {
		dir, err := os.MkdirTemp("", "bench-placer-")
		if err != nil {
			return nil, nil, err
		}
		st, err := sqlite.Open(ctx, filepath.Join(dir, "state.db"))
		if err != nil {
			return nil, nil, err
		}
		_, err = st.Migrate(ctx)
		return st, func() { st.Close(); os.RemoveAll(dir) }, err
	}
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, nil, err
	}
	cleanup := func() {
		conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(context.Background())
	}
	sep := "?"
	if strings.Contains(db, "?") {
		sep = "&"
	}
	st, err := postgres.Open(ctx, db+sep+"search_path="+schema)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		cleanup()
		return nil, nil, err
	}
	return st, func() { st.Close(); cleanup() }, nil
}
