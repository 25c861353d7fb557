// Package pgtest gives each test its own PostgreSQL schema on the test
// server, so tests run in parallel against one database.
package pgtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultURL is the test server: the machine's PostgreSQL with trust auth.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// ServerURL returns BETTER_COMPUTE_TEST_DATABASE_URL or DefaultURL.
func ServerURL() string {
	if u := os.Getenv("BETTER_COMPUTE_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// URL creates a fresh schema and returns a URL whose connections use it;
// the schema is dropped when the test ends. Its connections commit
// without waiting for the WAL flush (synchronous_commit=off): a scratch
// schema needs no durability across a crash of the server, and a test's
// transactions are no longer paced by the disk's fsync (the control
// plane's package tests on PostgreSQL take about a third less time).
// Transactions stay atomic and isolated as before. Without a reachable server the
// test is skipped, except under CI=true, where that is a failure.
func URL(t testing.TB) string {
	t.Helper()
	server := ServerURL()
	schema := scratch(t, "schema", "CREATE SCHEMA %s", "DROP SCHEMA %s CASCADE")
	u, err := url.Parse(server)
	if err != nil {
		t.Fatalf("parse %s: %v", server, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("synchronous_commit", "off")
	u.RawQuery = q.Encode()
	return fmt.Sprint(u)
}

// scratch makes an object of the test server under a fresh name with
// create (a format with one %s, the name) and drops it with drop when the
// test ends; it returns the name. Without a reachable server the test is
// skipped, except under CI=true, where that is a failure.
func scratch(t testing.TB, what, create, drop string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	server := ServerURL()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required in CI: %v", err)
		}
		t.Skipf("no PostgreSQL at %s (start it with pg_ctlcluster 15 main start): %v", server, err)
	}
	defer conn.Close(ctx)
	name := "t_" + strings.ToLower(rand.Text())[:16]
	if _, err := conn.Exec(ctx, fmt.Sprintf(create, name)); err != nil {
		t.Fatalf("create %s: %v", what, err)
	}
	t.Cleanup(func() {
		// DROP DATABASE takes a checkpoint and waits for the other
		// CREATE/DROP DATABASE of parallel tests: on a busy machine it
		// has taken over 30 s (CI, TestPostgresWakeThroughPgBouncer).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Errorf("drop %s %s: %v", what, name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, fmt.Sprintf(drop, name)); err != nil {
			t.Errorf("drop %s %s: %v", what, name, err)
		}
	})
	return name
}

// EnvPgBouncerURL names the test PgBouncer (tests/pgbouncer.sh start): a
// postgres:// URL of PgBouncer in transaction mode in front of ServerURL's
// server, its database part ignored. tests/run sets it.
const EnvPgBouncerURL = "BETTER_COMPUTE_TEST_PGBOUNCER_URL"

// Database creates a fresh database on the test server and returns its URL
// (direct) and the same database's URL through the test PgBouncer
// (EnvPgBouncerURL, with default_query_exec_mode=exec, as docs/scaling.md
// gives); the database is dropped when the test ends. A database rather
// than URL's schema: PgBouncer 1.18 refuses the search_path startup
// parameter. Without EnvPgBouncerURL, or without a reachable server, the
// test is skipped, except under CI=true, where that is a failure.
func Database(t testing.TB) (direct, bouncer string) {
	t.Helper()
	bouncerServer := os.Getenv(EnvPgBouncerURL)
	if bouncerServer == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required in CI (tests/run starts PgBouncer with tests/pgbouncer.sh start)", EnvPgBouncerURL)
		}
		t.Skipf("%s is not set: start PgBouncer with tests/pgbouncer.sh start and export what it prints", EnvPgBouncerURL)
	}
	server := ServerURL()
	// FORCE: PgBouncer keeps server connections to it open.
	name := scratch(t, "database", "CREATE DATABASE %s", "DROP DATABASE %s WITH (FORCE)")
	withDB := func(raw string, query map[string]string) string {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("parse %s: %v", raw, err)
		}
		u.Path = "/" + name
		q := u.Query()
		for k, v := range query {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return fmt.Sprint(u)
	}
	return withDB(server, nil), withDB(bouncerServer, map[string]string{"default_query_exec_mode": "exec"})
}

// Exec returns a function that runs raw SQL (one or more statements,
// simple protocol) at url, the schema of URL or Database, over a
// connection of its own, for tests that must set up a state the Store API
// cannot reach. The production store has no such hatch.
func Exec(url string) func(ctx context.Context, sql string) error {
	return func(ctx context.Context, sql string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return fmt.Errorf("connect for raw SQL: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("exec: %w", err)
		}
		return nil
	}
}
