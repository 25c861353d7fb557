package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/proto/jointoken"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestRemoteAdmin: an admin with only an API token (another HOME, no data
// directory, no configuration, no database) makes a site, a pool and a
// join token and revokes it through the API of a real serve, and the audit
// log names its token for each of them. A wrong token is refused with the
// server and the token's source named; a configuration file's own data
// directory gives its admin token.
func TestRemoteAdmin(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		d := newDeployment(t, backend)
		var made struct {
			APIToken struct {
				ID string `json:"id"`
			} `json:"apiToken"`
			Token string `json:"token"`
		}
		d.cliJSON(&made, d.viaAPI("tokens", "create", "--role", "admin", "--description", "remote admin")...)
		if made.APIToken.ID == "" || !strings.HasPrefix(made.Token, "bcat_") {
			t.Fatalf("tokens create = %+v", made)
		}

		// The remote admin's machine: its own HOME and nothing else.
		home := t.TempDir()
		remote := func(args ...string) (int, string, string) {
			t.Helper()
			return testenv.Run(t, []string{"HOME=" + home}, "", d.bc, append(args, "--server", d.api, "--token", made.Token)...)
		}
		ok := func(args ...string) string {
			t.Helper()
			code, out, errOut := remote(args...)
			if code != 0 {
				t.Fatalf("remote %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
			}
			return out
		}
		okJSON := func(v any, args ...string) {
			t.Helper()
			out := ok(append(args, "-o", "json")...)
			if err := json.Unmarshal([]byte(out), v); err != nil {
				t.Fatalf("remote %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		site := "remote-" + backend
		var s struct{ ID, Name string }
		okJSON(&s, "sites", "create", "--name", site, "--region", "default")
		var p struct{ ID, SiteID string }
		okJSON(&p, "pools", "create", "--name", site+"-pool", "--site", site)
		if s.ID == "" || p.SiteID != s.ID {
			t.Fatalf("site %+v, pool %+v", s, p)
		}
		file := filepath.Join(t.TempDir(), "join-token")
		var jt struct {
			JoinToken struct{ ID, PoolID, State string }
		}
		okJSON(&jt, "join-tokens", "create", "--pool", site+"-pool", "--max-uses", "2", "--out", file)
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if tok, err := jointoken.Parse(string(b)); err != nil || tok.ID() != jt.JoinToken.ID || jt.JoinToken.PoolID != p.ID {
			t.Fatalf("join token %+v, file: %v", jt, err)
		}
		ok("join-tokens", "revoke", jt.JoinToken.ID)
		if out := ok("join-tokens", "list"); !strings.Contains(out, jt.JoinToken.ID) || !strings.Contains(out, "revoked") {
			t.Fatalf("join-tokens list:\n%s", out)
		}
		if entries, err := os.ReadDir(home); err != nil || len(entries) != 0 {
			t.Fatalf("the remote CLI wrote %v into its HOME (%v)", entries, err)
		}

		// Each change is audited under the remote admin's token.
		actor := "token:" + made.APIToken.ID
		var log struct {
			Entries []struct{ Actor, Action, Resource, Outcome string }
		}
		okJSON(&log, "audit", "list", "--actor", actor)
		var actions []string
		for _, e := range log.Entries {
			if e.Actor != actor || e.Outcome != "ok" {
				t.Errorf("audit row %+v, want actor %s", e, actor)
			}
			actions = append(actions, e.Action)
		}
		if want := "joinTokens.revoke joinTokens.create pools.create sites.create"; strings.Join(actions, " ") != want {
			t.Fatalf("audit rows of %s, newest first: %v, want %s", actor, actions, want)
		}
		var cli struct{ Entries []struct{ Actor string } }
		okJSON(&cli, "audit", "list", "--method", "sites.create", "--object", site)
		if len(cli.Entries) != 1 || cli.Entries[0].Actor != actor {
			t.Fatalf("sites.create of %s audited as %+v", site, cli.Entries)
		}

		// A wrong token: the answer names the server and the token's source.
		code, _, errOut := testenv.Run(t, []string{"HOME=" + home}, "", d.bc, "sites", "list", "--server", d.api, "--token", "bcat_wrong")
		if want := fmt.Sprintf("UNAUTHENTICATED: unknown token (server %s/api from --server; token from --token)", d.api); code != 1 || !strings.Contains(errOut, want) {
			t.Fatalf("wrong token: exit %d, stderr %q, want %q", code, errOut, want)
		}
		code, _, errOut = testenv.Run(t, []string{"HOME=" + home, "BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=bcat_wrong"}, "", d.bc, "nodes", "list")
		if code != 1 || !strings.Contains(errOut, "from BETTER_COMPUTE_URL; token from BETTER_COMPUTE_TOKEN)") {
			t.Fatalf("wrong token from the environment: exit %d, stderr %q", code, errOut)
		}
		if backend != backendSQLite {
			return
		}
		// --config F: F's host.listen and F's dataDir's admin-token, with
		// nothing in the environment pointing at them.
		cfg := testenv.WriteFile(t, "local.yaml", fmt.Sprintf("dataDir: %s\nhost:\n  listen: %s\n", d.dataDir, strings.TrimPrefix(d.api, "http://")))
		code, out, errOut := testenv.Run(t, []string{"HOME=" + home}, "", d.bc, "--config", cfg, "sites", "list")
		if code != 0 || !strings.Contains(out, site) {
			t.Fatalf("--config %s sites list: exit %d\n%s%s", cfg, code, out, errOut)
		}
	})
}
