package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// The two store backends every fleet scenario runs on.
const (
	backendSQLite   = "sqlite"   // the embedded default: no database URL, a data dir
	backendPostgres = "postgres" // pgtest's fresh schema, pki init and issue-gateway
)

var fleetBackends = []string{backendSQLite, backendPostgres}

// forEachBackend runs fn as a parallel subtest per backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	t.Helper()
	for _, b := range fleetBackends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

// deployment is a control plane under test: one better-compute serve
// process (all roles) on fixed loopback ports, so that a restart listens
// where the daemons dial, and a read-only view of its database.
type deployment struct {
	t       *testing.T
	backend string
	bc      string   // better-compute binary
	env     []string // every better-compute process's environment
	cfgFile string
	dataDir string
	dbURL   string // "" on the embedded default

	api        string // http://127.0.0.1:port
	gatewayURL string // https://localhost:port, what daemons dial
	gwAddr     string // 127.0.0.1:port
	adminToken string // API bearer token with the admin role
	serve      *testenv.Proc

	// st reads the deployment's database (SQLite beside the running
	// serve, WAL mode; PostgreSQL through its own pool).
	st store.Store
}

// newDeployment starts serve on a fresh database of backend. On PostgreSQL
// it migrates, runs pki init --trust-domain e2e.test and pki issue-gateway,
// and creates the site e2e (region default) and its pool default, which the
// embedded default makes by itself.
func newDeployment(t *testing.T, backendName string) *deployment {
	t.Helper()
	return newDeploymentWith(t, backendName, deploymentConfig{})
}

// deploymentConfig adds lines to a deployment's configuration file.
type deploymentConfig struct {
	gateway string // under host.gateway, indented four spaces: "    nodeCertTTL: 10s\n"
	host    string // under host, indented two spaces: "  metrics:\n    bearerToken: x\n"
	top     string // at the top level: "pki:\n  reattestGrace: 5s\n"
}

// newDeploymentWith is newDeployment with extra configuration.
func newDeploymentWith(t *testing.T, backendName string, extra deploymentConfig) *deployment {
	t.Helper()
	ctx := context.Background()
	d := &deployment{t: t, backend: backendName, bc: testenv.Binary(t, "better-compute"),
		dataDir: filepath.Join(t.TempDir(), "data")}
	apiPort, gwPort := freePort(t), freePort(t)
	d.api = fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	d.gwAddr = fmt.Sprintf("127.0.0.1:%d", gwPort)
	d.gatewayURL = fmt.Sprintf("https://localhost:%d", gwPort)
	cfg := extra.top + fmt.Sprintf("host:\n  listen: 127.0.0.1:%d\n", apiPort) + extra.host +
		fmt.Sprintf("  gateway:\n    listen: %s\n", d.gwAddr) + extra.gateway
	d.env = []string{"BETTER_COMPUTE_DATA_DIR=" + d.dataDir}
	if backendName == backendPostgres {
		d.dbURL = pgtest.URL(t)
		d.env = append(d.env, "BETTER_COMPUTE_DATABASE_URL="+d.dbURL, "BETTER_COMPUTE_SECRET="+testSecret)
		cfg += initPostgresPKI(t, d.env)
	}
	d.cfgFile = testenv.WriteFile(t, "better-compute.yaml", cfg)
	d.start()

	st, err := backend.Open(ctx, d.dbURL, d.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d.st = st
	if backendName == backendSQLite {
		// The CLI finds this token by itself in the data directory.
		b, err := os.ReadFile(filepath.Join(d.dataDir, "admin-token"))
		if err != nil {
			t.Fatalf("embedded default's admin token: %v", err)
		}
		d.adminToken = strings.TrimSpace(string(b))
	} else {
		secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin, Description: "e2e"})
		if err != nil {
			t.Fatal(err)
		}
		d.adminToken = secret
		// No admin-token file beside PostgreSQL: operator commands take
		// the token from the environment.
		d.env = append(d.env, "BETTER_COMPUTE_TOKEN="+secret)
		d.cli("sites", "create", "--name", "e2e", "--region", "default")
		d.cli("pools", "create", "--name", "default", "--site", "e2e")
	}
	return d
}

// start runs serve and waits until its API and gateway listen.
func (d *deployment) start() {
	d.t.Helper()
	d.serve = testenv.Start(d.t, d.env, d.bc, "serve", "--config", d.cfgFile)
	d.serve.WaitLine(`msg="API listening"`, 60*time.Second)
	d.serve.WaitLine(`msg="Gateway listening" .*addr=`+regexp.QuoteMeta(d.gwAddr), 60*time.Second)
}

// secret is the deployment secret: the embedded default generates one in
// its data dir.
func (d *deployment) secret() string {
	d.t.Helper()
	if d.backend == backendPostgres {
		return testSecret
	}
	b, err := os.ReadFile(filepath.Join(d.dataDir, "secret"))
	if err != nil {
		d.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// cli runs better-compute with the deployment's configuration and returns
// its standard output; a failure fails the test.
func (d *deployment) cli(args ...string) string {
	d.t.Helper()
	code, stdout, stderr := testenv.Run(d.t, d.env, "", d.bc, append([]string{"--config", d.cfgFile}, args...)...)
	if code != 0 {
		d.t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// cliJSON runs a command with -o json and decodes its output into v.
func (d *deployment) cliJSON(v any, args ...string) {
	d.t.Helper()
	out := d.cli(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		d.t.Fatalf("better-compute %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// joinToken creates a join token for the pool default and returns its file
// and id.
func (d *deployment) joinToken(maxUses int, ttl time.Duration) (file, id string) {
	d.t.Helper()
	file = filepath.Join(d.t.TempDir(), "join-token")
	var res struct {
		JoinToken struct {
			ID string `json:"id"`
		} `json:"joinToken"`
	}
	d.cliJSON(&res, "join-tokens", "create", "--pool", "default", "--max-uses", fmt.Sprint(maxUses),
		"--ttl", ttl.String(), "--out", file)
	if res.JoinToken.ID == "" {
		d.t.Fatal("join-tokens create -o json gave no id")
	}
	return file, res.JoinToken.ID
}

// apiNode is a node as `nodes list -o json` shows it.
type apiNode struct {
	ID        string `json:"id"`
	Hostname  string `json:"hostname"`
	State     string `json:"state"`
	GatewayID string `json:"gatewayId"`
}

// nodes lists the nodes through the API with the CLI.
func (d *deployment) nodes() map[string]apiNode {
	d.t.Helper()
	var resp struct {
		Nodes []apiNode `json:"nodes"`
	}
	d.cliJSON(&resp, "nodes", "list", "--server", d.api, "--token", d.adminToken)
	m := map[string]apiNode{}
	for _, n := range resp.Nodes {
		m[n.ID] = n
	}
	return m
}

// eventually is testenv.Eventually.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, describe func() string) {
	t.Helper()
	testenv.Eventually(t, timeout, cond, describe)
}

// machine is a host for a real bcd (testenv.Machine): its own hostname,
// /etc/machine-id and boot id, and its own data dir.
type machine struct {
	t          *testing.T
	name       string
	dataDir    string
	idFile     string
	bootIDFile string
}

// newMachine makes a machine named name (a valid hostname).
func newMachine(t *testing.T, name string) *machine {
	t.Helper()
	m := testenv.NewMachine(t, name)
	return &machine{t: t, name: m.Name, dataDir: m.DataDir, idFile: m.IDFile, bootIDFile: m.BootIDFile}
}

// tm is m as a testenv.Machine.
func (m *machine) tm() *testenv.Machine {
	tm := testenv.NewMachineAt(m.t, m.name, m.dataDir, m.idFile)
	tm.BootIDFile = m.bootIDFile
	return tm
}

// argv returns the program and arguments that run bcd with args on m.
func (m *machine) argv(args ...string) (string, []string) {
	return m.tm().Argv(args...)
}

// boot gives m a new boot id (testenv.Machine.Boot), as booting it does.
func (m *machine) boot() {
	m.t.Helper()
	m.tm().Boot()
}

// join runs bcd join on m and returns its exit code, stdout and stderr.
func (m *machine) join(gatewayURL, tokenFile string) (int, string, string) {
	m.t.Helper()
	bin, args := m.argv("join", "--gateway", gatewayURL, "--token-file", tokenFile, "--data-dir", m.dataDir)
	return testenv.Run(m.t, nil, "", bin, args...)
}

// mustJoin joins m and returns its node id.
func (m *machine) mustJoin(gatewayURL, tokenFile string) string {
	m.t.Helper()
	code, stdout, stderr := m.join(gatewayURL, tokenFile)
	if code != 0 {
		m.t.Fatalf("bcd join on %s: exit %d\n%s%s", m.name, code, stdout, stderr)
	}
	match := regexp.MustCompile(`Joined as node (\S+) `).FindStringSubmatch(stdout)
	if match == nil {
		m.t.Fatalf("bcd join on %s printed no node id: %q", m.name, stdout)
	}
	return match[1]
}

// node starts bcd node on m.
func (m *machine) node() *testenv.Proc {
	m.t.Helper()
	bin, args := m.argv("node", "--data-dir", m.dataDir)
	return testenv.Start(m.t, nil, bin, args...)
}

// joined reports whether m's data dir holds an identity.
func (m *machine) joined() bool {
	_, err := os.Stat(filepath.Join(m.dataDir, "identity.json"))
	return !errors.Is(err, os.ErrNotExist)
}

// countLines counts p's output lines matching re.
func countLines(p *testenv.Proc, re *regexp.Regexp) int {
	n := 0
	for l := range strings.SplitSeq(p.Output(), "\n") {
		if re.MatchString(l) {
			n++
		}
	}
	return n
}
