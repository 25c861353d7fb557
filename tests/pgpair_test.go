package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgBinDir is where Debian's PostgreSQL 15 server tools live.
const pgBinDir = "/usr/lib/postgresql/15/bin"

// pgServer is one PostgreSQL cluster of a pgPair: its data directory, its
// port on 127.0.0.1 and its unix socket directory.
type pgServer struct {
	name string
	data string
	port int
	sock string
	log  string
}

// url is a direct URL of the server's database db.
func (s *pgServer) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", s.port, db)
}

// pgPair is a primary and a streaming standby in synchronous replication
// (synchronous_commit = on, synchronous_standby_names naming the standby),
// made with initdb and pg_basebackup in a temporary directory, on free
// ports, as the postgres user when the test runs as root. The machine's own
// cluster is left alone.
type pgPair struct {
	t        *testing.T
	dir      string
	primary  *pgServer
	standby  *pgServer
	asPG     bool // run the tools with runuser -u postgres
	promoted time.Time
}

// pgTools skips the test when the PostgreSQL server tools are not on the
// machine (a failure under CI=true, where they must be).
func pgTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"initdb", "pg_ctl", "pg_basebackup", "postgres"} {
		if _, err := os.Stat(filepath.Join(pgBinDir, tool)); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("PostgreSQL server tool %s is missing (%v) and CI=true: the failover test must run", tool, err)
			}
			t.Skipf("PostgreSQL server tool %s is missing: %v", tool, err)
		}
	}
}

// newPGPair makes, starts and connects the two clusters, creates database
// db on the primary, and waits until the standby replicates synchronously.
// Both are stopped (immediate mode) in t.Cleanup.
func newPGPair(t *testing.T, db string) *pgPair {
	t.Helper()
	pgTools(t)
	dir, err := os.MkdirTemp("", "bc-failover-")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgPair{t: t, dir: dir, asPG: os.Geteuid() == 0}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if p.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("running as root and no postgres user to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	server := func(name string) *pgServer {
		return &pgServer{name: name, data: filepath.Join(dir, name), port: freePort(t), sock: dir,
			log: filepath.Join(dir, name+".log")}
	}
	p.primary, p.standby = server("primary"), server("standby")

	p.tool("initdb", "-D", p.primary.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
	// fsync off: the test kills processes, not the machine, and what was
	// written reaches the files through the page cache either way; the
	// durability under test is synchronous replication's.
	p.appendConf(p.primary, fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
max_connections = 200
wal_level = replica
max_wal_senders = 4
wal_keep_size = '256MB'
hot_standby = on
fsync = off
synchronous_commit = on
synchronous_standby_names = 'standby'
`, p.primary.port, dir))
	p.appendHBA(p.primary, "host replication postgres 127.0.0.1/32 trust\nlocal replication postgres trust\n")
	p.start(p.primary)
	t.Cleanup(func() { p.stop(p.primary) })

	p.tool("pg_basebackup", "-h", dir, "-p", strconv.Itoa(p.primary.port), "-U", "postgres", "-D", p.standby.data,
		"-X", "stream", "--no-sync")
	// The standby names itself so the primary waits for it; once promoted
	// it asks for no synchronous standby of its own (none is left), as
	// Patroni does when the last synchronous standby is gone.
	p.appendConf(p.standby, fmt.Sprintf(`
port = %d
synchronous_standby_names = ''
primary_conninfo = 'host=%s port=%d user=postgres application_name=standby'
`, p.standby.port, dir, p.primary.port))
	if err := os.WriteFile(filepath.Join(p.standby.data, "standby.signal"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p.chown(p.standby.data)
	p.start(p.standby)
	t.Cleanup(func() { p.stop(p.standby) })

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, p.primary.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	var state string
	eventually(t, 30*time.Second, func() bool {
		err := conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'`).Scan(&state)
		return err == nil && state == "sync"
	}, func() string { return "the standby does not replicate synchronously: sync_state " + state })
	return p
}

// tool runs a PostgreSQL tool, as postgres when the test runs as root.
func (p *pgPair) tool(name string, args ...string) string {
	p.t.Helper()
	path := filepath.Join(pgBinDir, name)
	var cmd *exec.Cmd
	if p.asPG {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		p.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// chown gives path, recursively, to postgres when the test runs as root.
func (p *pgPair) chown(path string) {
	p.t.Helper()
	if !p.asPG {
		return
	}
	if out, err := exec.Command("chown", "-R", "postgres:", path).CombinedOutput(); err != nil {
		p.t.Fatalf("chown %s: %v\n%s", path, err, out)
	}
}

func (p *pgPair) appendConf(s *pgServer, conf string) {
	p.appendFile(filepath.Join(s.data, "postgresql.auto.conf"), conf)
}
func (p *pgPair) appendHBA(s *pgServer, hba string) {
	p.appendFile(filepath.Join(s.data, "pg_hba.conf"), hba)
}

func (p *pgPair) appendFile(path, text string) {
	p.t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pgPair) start(s *pgServer) {
	p.t.Helper()
	p.tool("pg_ctl", "-D", s.data, "-l", s.log, "-w", "-t", "60", "start")
}

// stop stops s at once, if it runs.
func (p *pgPair) stop(s *pgServer) {
	if _, err := os.Stat(filepath.Join(s.data, "postmaster.pid")); err != nil {
		return
	}
	args := []string{"-D", s.data, "-m", "immediate", "-w", "stop"}
	path := filepath.Join(pgBinDir, "pg_ctl")
	if p.asPG {
		_ = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...).Run()
	} else {
		_ = exec.Command(path, args...).Run()
	}
}

// killPrimary kills the primary's postmaster and every process it started
// with SIGKILL, as a machine that dies takes them all at once, and returns
// once they are gone.
func (p *pgPair) killPrimary() {
	p.t.Helper()
	b, err := os.ReadFile(filepath.Join(p.primary.data, "postmaster.pid"))
	if err != nil {
		p.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		p.t.Fatal(err)
	}
	out, _ := exec.Command("pgrep", "-P", strconv.Itoa(pid)).Output()
	pids := []int{pid}
	for _, f := range strings.Fields(string(out)) {
		if c, err := strconv.Atoi(f); err == nil {
			pids = append(pids, c)
		}
	}
	for _, q := range pids {
		_ = syscall.Kill(q, syscall.SIGKILL)
	}
	eventually(p.t, 10*time.Second, func() bool {
		for _, q := range pids {
			if syscall.Kill(q, 0) == nil {
				return false
			}
		}
		return true
	}, func() string { return "the primary's processes are still running after SIGKILL" })
	// The data directory stays, with its postmaster.pid: stop() must not
	// find a server to stop there.
	_ = os.Remove(filepath.Join(p.primary.data, "postmaster.pid"))
}

// promote promotes the standby (pg_ctl promote -w: it returns once the
// standby accepts writes) and records when.
func (p *pgPair) promote() {
	p.t.Helper()
	p.tool("pg_ctl", "-D", p.standby.data, "-w", "-t", "60", "promote")
	p.promoted = time.Now()
}

// ports is the primary's and the standby's port.
func (p *pgPair) ports() (int, int) { return p.primary.port, p.standby.port }
