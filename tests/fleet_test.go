package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// sessionEstablished is bcd node's line for each Welcome.
var sessionEstablished = regexp.MustCompile(`msg="Session established"`)

// TestFleet runs real daemons against a real serve on each backend: three
// bcd join + bcd node hold sessions; a kill -9 and restart of serve brings
// all three back within 30 s; a revoked node's session ends within 5 s and
// it cannot reconnect; 20 concurrent joins on a token of max-uses 8 admit
// exactly 8.
func TestFleet(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		d := newDeployment(t, backend)

		// Three machines join with one token and hold sessions.
		tokenFile, _ := d.joinToken(3, time.Hour)
		machines := make([]*machine, 3)
		ids := make([]string, 3)
		procs := make([]*testenv.Proc, 3)
		for i := range machines {
			machines[i] = newMachine(t, fmt.Sprintf("gpu-%02d", i+1))
			ids[i] = machines[i].mustJoin(d.gatewayURL, tokenFile)
		}
		if len(slices.Compact(slices.Sorted(slices.Values(ids)))) != 3 {
			t.Fatalf("three machines joined as %v, want three nodes", ids)
		}
		for i, m := range machines {
			procs[i] = m.node()
		}
		for _, p := range procs {
			p.WaitLine(sessionEstablished.String(), 30*time.Second)
		}
		var before map[string]apiNode
		eventually(t, 10*time.Second, func() bool {
			before = d.nodes()
			for _, id := range ids {
				if n := before[id]; n.GatewayID == "" || n.State != "ready" {
					return false
				}
			}
			return true
		}, func() string { return fmt.Sprintf("nodes list: %+v, want %v ready with a gateway", before, ids) })
		oldGateway := before[ids[0]].GatewayID
		t.Logf("three sessions on gateway %s", oldGateway)

		// kill -9 of serve, and a restart on the same ports.
		killed := time.Now()
		d.serve.Kill()
		restarted := time.Now()
		d.start()
		up := time.Now()
		eventually(t, 30*time.Second, func() bool {
			for _, p := range procs {
				if countLines(p, sessionEstablished) < 2 {
					return false
				}
			}
			return true
		}, func() string { return "the three daemons did not all reconnect" })
		back := time.Now()
		t.Logf("%s: all three daemons back %v after the kill -9 (serve restarted in %v; daemons back %v after it listened)",
			backend, back.Sub(killed).Round(time.Millisecond), up.Sub(restarted).Round(time.Millisecond), back.Sub(up).Round(time.Millisecond))
		if back.Sub(restarted) > 30*time.Second {
			t.Fatalf("daemons back %v after the restart, want within 30 s", back.Sub(restarted))
		}
		var after map[string]apiNode
		eventually(t, 10*time.Second, func() bool {
			after = d.nodes()
			gw := after[ids[0]].GatewayID
			for _, id := range ids {
				if n := after[id]; n.GatewayID != gw || gw == "" || gw == oldGateway {
					return false
				}
			}
			return true
		}, func() string {
			return fmt.Sprintf("nodes list after the restart: %+v, want all on one new gateway (not %s)", after, oldGateway)
		})

		// A revoked node's session ends within 5 s; bcd node exits 3.
		revoked, victim := ids[0], procs[0]
		d.cli("pki", "revoke", "--node", revoked)
		revokedAt := time.Now()
		select {
		case <-victim.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("bcd node of revoked node %s still running 5 s after pki revoke", revoked)
		}
		t.Logf("%s: revoked node's bcd node exited %v after pki revoke returned", backend, time.Since(revokedAt).Round(time.Millisecond))
		if code := victim.Wait(time.Second); code != 3 {
			t.Fatalf("bcd node of a revoked node exited %d, want 3", code)
		}
		victim.WaitLine(`bcd: .*revoked`, time.Second)
		eventually(t, 5*time.Second, func() bool {
			_, err := d.st.SessionGet(ctx, revoked)
			return errors.Is(err, store.ErrNotFound)
		}, func() string { return "the revoked node's session row is still there" })
		// It cannot reconnect: a restarted bcd node is refused and exits 3.
		again := machines[0].node()
		if code := again.Wait(30 * time.Second); code != 3 {
			t.Fatalf("bcd node of a revoked node, started again, exited %d, want 3", code)
		}
		again.WaitLine(`bcd: .*revoked`, time.Second)
		if _, err := d.st.SessionGet(ctx, revoked); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("revoked node has a session again (%v)", err)
		}
		for i, id := range ids[1:] {
			if s, err := d.st.SessionGet(ctx, id); err != nil {
				t.Fatalf("node %s lost its session with the revocation of another: %v", id, err)
			} else if countLines(procs[i+1], sessionEstablished) != 2 {
				t.Fatalf("node %s reconnected after the revocation of another (session %s)", id, s.SessionID)
			}
		}

		// 20 concurrent joins on a token of max-uses 8 admit exactly 8.
		tokenFile, tokenID := d.joinToken(8, time.Hour)
		type result struct {
			code           int
			stdout, stderr string
		}
		results := make([]result, 20)
		var wg sync.WaitGroup
		for i := range results {
			m := newMachine(t, fmt.Sprintf("rush-%02d", i))
			wg.Go(func() {
				code, stdout, stderr := m.join(d.gatewayURL, tokenFile)
				results[i] = result{code, stdout, stderr}
			})
		}
		wg.Wait()
		admitted := 0
		for _, r := range results {
			switch {
			case r.code == 0:
				admitted++
			case r.code != 1 || !strings.Contains(r.stderr, "join token used up"):
				t.Errorf("refused concurrent join: exit %d, stderr %q; want 1 and \"join token used up\"", r.code, r.stderr)
			}
		}
		if admitted != 8 {
			t.Fatalf("20 concurrent joins on a token of max-uses 8 admitted %d", admitted)
		}
		tok, err := d.st.JoinTokenGet(ctx, tokenID)
		if err != nil || tok.Uses != 8 {
			t.Fatalf("token after the rush: %+v (%v), want 8 uses", tok, err)
		}
		// Each admitted join has its row; the 12 refusals of a used-up
		// token, all from one address, are summarised (issue 28): the
		// first is written at once, counting itself, and the rest wait for
		// the next row of their window (admission.RefusalSummaryEvery).
		outcomes := map[string]int{}
		for _, e := range auditJoins(t, d, 0) {
			if !strings.Contains(string(e.Details), tokenID) {
				continue
			}
			outcomes[e.Outcome]++
			if e.Outcome != admission.OutcomeRefused {
				continue
			}
			var det struct {
				Refusal  string `json:"refusal"`
				Refusals int    `json:"refusals"`
			}
			if err := json.Unmarshal(e.Details, &det); err != nil {
				t.Fatal(err)
			}
			if det.Refusal != admission.RefusalTokenExhausted || det.Refusals != 1 {
				t.Fatalf("the rush's refusal row: %s", e.Details)
			}
		}
		if outcomes[admission.OutcomeSuccess] != 8 || outcomes[admission.OutcomeRefused] != 1 || len(outcomes) != 2 {
			t.Fatalf("audit rows of the rush: %v, want 8 success and 1 refused (the first of 12, summarised)", outcomes)
		}
		rush := 0
		for _, n := range d.nodes() {
			if strings.HasPrefix(n.Hostname, "rush-") {
				rush++
			}
		}
		if rush != 8 {
			t.Fatalf("%d nodes from the rush, want 8", rush)
		}
	})
}

// auditJoins returns the node.join audit rows after id afterID.
func auditJoins(t *testing.T, d *deployment, afterID int64) []*store.AuditEntry {
	t.Helper()
	var out []*store.AuditEntry
	for {
		page, err := d.st.AuditList(context.Background(), afterID, 500)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			if e.Action == admission.ActionJoin {
				out = append(out, e)
			}
		}
		if len(page) < 500 {
			return out
		}
		afterID = page[len(page)-1].ID
	}
}
