package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// testEvents drives every state change the store makes and checks that each
// writes its CloudEvents envelope to the outbox in its transaction: every
// type of events.Types at least once, each envelope with the attributes
// CloudEvents 1.0 requires, its topic and key equal to its type and
// subject, and its data decoding strictly into the type's data struct.
func testEvents(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	now := time.Now().UTC()
	later := now.Add(time.Hour)
	hash := []byte("0123456789abcdef0123456789abcdef")

	// Join tokens: created, used, exhausted, revoked, expired.
	jt := must(st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: "jt_ev1", SecretHash: hash, PoolID: pool.ID, MaxUses: 1, ExpiresAt: now.Add(2 * time.Hour)}))
	must(st.JoinTokenConsume(ctx, jt.ID, hash, nil))
	must(st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: "jt_ev2", SecretHash: hash, PoolID: pool.ID, MaxUses: 5, ExpiresAt: now.Add(time.Minute)}))
	must(st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: "jt_ev3", SecretHash: hash, PoolID: pool.ID, MaxUses: 5, ExpiresAt: now.Add(time.Hour)}))
	check(t, st.JoinTokenRevoke(ctx, "jt_ev3"))
	check(t, st.JoinTokenRevoke(ctx, "jt_ev3")) // a second revocation writes nothing
	if got := must(st.JoinTokensExpire(ctx, &later)); len(got) != 1 || got[0] != "jt_ev2" {
		t.Fatalf("expired join tokens = %v, want [jt_ev2]", got)
	}
	if got := must(st.JoinTokensExpire(ctx, &later)); len(got) != 0 {
		t.Fatalf("join tokens expired twice: %v", got)
	}

	// Nodes: joined, rejoined, ready, cordoned, uncordoned, powered-off,
	// drained, reattested, revoked, deleted, unreachable, unresponsive.
	join := func(id string) {
		must(st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id + ".example", MachineID: "m-" + id,
			KeySHA256: "k-" + id, JoinTokenID: jt.ID}))
	}
	join("node_ev1")
	join("node_ev1")
	join("node_ev2")
	join("node_ev3")
	// A session refreshing versions writes nothing.
	must(st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_ev1", PoolID: pool.ID, Hostname: "node_ev1.example", MachineID: "m-node_ev1", BCDVersion: "9"}))
	for _, id := range []string{"node_ev1", "node_ev2", "node_ev3"} {
		check(t, st.NodeSetState(ctx, id, store.NodeReady))
	}
	check(t, st.NodeSetState(ctx, "node_ev1", store.NodeReady)) // no change, no event
	join("node_ev4")
	must(st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: "node_ev4", Reason: store.DisruptionQuarantined, Owner: "t"}))
	rolledBackAt := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	check(t, st.NodeRolledBackLocally(ctx, &store.NodeRolledBackLocallyParams{NodeID: "node_ev4", FromVersion: "0.2.0", ToVersion: "0.1.0",
		Reason: "3 starts of 0.2.0 ended in an exit within 10m0s of the upgrade", Starts: 3, RolledBackAt: rolledBackAt}))
	if err := st.NodeRolledBackLocally(ctx, &store.NodeRolledBackLocallyParams{NodeID: "node_nope", FromVersion: "0.2.0"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("local rollback of an unknown node: %v, want ErrNotFound", err)
	}
	check(t, st.NodeSetCordoned(ctx, "node_ev1", true))
	check(t, st.NodeSetCordoned(ctx, "node_ev1", false))
	check(t, st.NodeSetState(ctx, "node_ev1", store.NodeClockSkewed))
	check(t, st.NodeSetState(ctx, "node_ev1", store.NodePoweredOff))
	check(t, st.NodeSetState(ctx, "node_ev1", store.NodeDraining))
	check(t, st.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{ID: "node_ev1", Serial: "0a", NotAfter: now.Add(24 * time.Hour), Reattested: true}))
	check(t, st.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{ID: "node_ev1", Serial: "0b", NotAfter: now.Add(24 * time.Hour)})) // a renewal: none
	check(t, st.RevocationInsert(ctx, &store.Revocation{Serial: "0a", NodeID: "node_ev1", Reason: "reinstalled"}))
	check(t, st.RevocationInsert(ctx, &store.Revocation{Serial: "0a", NodeID: "node_ev1", Reason: "reinstalled"})) // twice: one event
	mustOpen(t, h, ctx, "node_ev3", "sess_ev3", "gw_gone")
	for _, id := range []string{"node_ev2", "node_ev3"} {
		mustPair(st.NodeLivenessReconcile(ctx, &store.NodeLivenessParams{Shard: store.ShardOf(id), StaleAfter: time.Minute, Now: &later}))
	}

	// A rolled-back change writes no event.
	before := must(st.OutboxMaxID(ctx))
	boom := errors.New("roll back")
	if err := st.Tx(ctx, func(tx store.Store) error {
		if err := tx.NodeSetCordoned(ctx, "node_ev2", true); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("tx = %v", err)
	}
	if after := must(st.OutboxMaxID(ctx)); after != before {
		t.Fatalf("a rolled-back cordon left outbox entries: max id %d, was %d", after, before)
	}

	// A GPU event with its XID.
	must(st.EventInsert(ctx, &store.Event{NodeID: "node_ev2", Kind: "gpu.xid", Severity: "critical", Message: "XID 79",
		GPUFinding: &sessionv1.GPUFinding{GpuUuid: "GPU-ev", Signal: &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: 79}}}}))
	must(st.EventInsert(ctx, &store.Event{NodeID: "node_ev2", Kind: "node.reboot"})) // not a GPU: none

	// Commands: created and every terminal state.
	enqueue := func(timeout time.Duration) *store.Command {
		return must(st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_ev2"}, Kind: "exec", CreatedBy: "t", Timeout: timeout}))[0]
	}
	ok, fail, cancel, expire, lose := enqueue(time.Hour), enqueue(time.Hour), enqueue(time.Hour), enqueue(time.Minute), enqueue(24*time.Hour)
	zero, one := 0, 1
	must(st.CommandFinish(ctx, &store.CommandFinishParams{ID: ok.ID, State: store.CommandSucceeded, ExitCode: &zero}))
	must(st.CommandFinish(ctx, &store.CommandFinishParams{ID: fail.ID, State: store.CommandFailed, ExitCode: &one, Error: "exit status 1"}))
	if done := must(st.CommandFinish(ctx, &store.CommandFinishParams{ID: fail.ID, State: store.CommandSucceeded, ExitCode: &zero})); done {
		t.Fatal("a second finish won")
	}
	must(st.CommandRequestCancel(ctx, cancel.ID))
	must(st.CommandSetState(ctx, &store.CommandSetStateParams{ID: lose.ID, State: store.CommandDispatched, GatewayID: "gw_gone"}))
	sw := must(st.CommandSweep(ctx, &store.CommandSweepParams{LostAfter: time.Minute, Now: &later}))
	if len(sw.Expired) != 1 || sw.Expired[0].ID != expire.ID || len(sw.Lost) != 1 || sw.Lost[0].ID != lose.ID {
		t.Fatalf("sweep = expired %v, lost %v", ids(sw.Expired), ids(sw.Lost))
	}
	check(t, st.NodeDelete(ctx, "node_ev2"))

	// Gateways: up on a new row only, down when deregistered or reaped.
	for range 2 {
		must(st.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw_ev1", Region: "eu-1", Address: "a:8443", Version: "1", MaxStreams: 10}))
	}
	check(t, st.GatewayDelete(ctx, "gw_ev1"))
	must(st.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw_gone", Region: "eu-1", MaxStreams: 10}))
	if res := must(st.GatewayReap(ctx, &store.GatewayReapParams{LeasePrefix: store.GatewayLeasePrefix, PruneAfter: time.Hour})); len(res.Dead) != 1 {
		t.Fatalf("reaped %v, want gw_gone", res.Dead)
	}

	// API tokens.
	tok := &store.APIToken{ID: "tok_ev", Role: store.RoleViewer, Description: "events"}
	check(t, st.APITokenCreate(ctx, tok, []byte("tok-ev-hash")))
	check(t, st.APITokenRevoke(ctx, tok.ID))
	check(t, st.APITokenRevoke(ctx, tok.ID))
	soon := now.Add(24 * time.Hour)
	check(t, st.APITokenCreate(ctx, &store.APIToken{ID: "tok_ev2", Role: store.RoleViewer, ExpiresAt: &soon}, []byte("tok-ev2-hash")))
	if got := must(st.APITokensWarnExpiring(ctx, &store.APITokenExpiryParams{Within: 7 * 24 * time.Hour, Now: &now})); len(got) != 1 {
		t.Fatalf("expiring API tokens = %v, want [tok_ev2]", got)
	}

	// Remediation: every step of a case, pause, the breaker.
	remediationEvents(ctx, t, h, pool)

	// Rollouts: every rollout.* type (rollouts.go).
	produceRolloutEvents(ctx, t, h, pool)

	// Reservations: every reservation.* type (reservations.go).
	produceReservationEvents(ctx, t, h, pool)

	// Tunnels: opened and closed (tunnels.go).
	produceTunnelEvents(ctx, t, h, pool)

	// GPUs: a UUID two live nodes list (gpus.go).
	produceGPUConflictEvents(ctx, t, h, pool)

	// CA rotations: every pki.rotation-* type (pkirotations.go).
	producePKIRotationEvents(ctx, t, h)

	// Access requests: every access.* type (access.go).
	produceAccessEvents(ctx, t, h)

	entries := must(st.OutboxList(ctx, 0, store.MaxListLimit))
	count := map[string]int{}
	var bySubject = map[string][]string{}
	dataOf := map[string]json.RawMessage{}
	for _, e := range entries {
		env, err := events.Parse(e.Payload)
		if err != nil {
			t.Fatalf("outbox entry %d: %v\n%s", e.ID, err, e.Payload)
		}
		if env.Type != e.Topic || env.Subject != e.Key || env.Source != events.Source || env.DataContentType != events.ContentType {
			t.Fatalf("outbox entry %d (topic %q, key %q): envelope %+v", e.ID, e.Topic, e.Key, env)
		}
		info, known := typeInfo(env.Type)
		if !known {
			t.Fatalf("outbox entry %d: type %q is not in events.Types", e.ID, env.Type)
		}
		data := reflect.New(reflect.TypeOf(info.Data))
		dec := json.NewDecoder(bytes.NewReader(env.Data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(data.Interface()); err != nil {
			t.Fatalf("outbox entry %d (%s): data %s: %v", e.ID, env.Type, env.Data, err)
		}
		count[env.Type]++
		bySubject[env.Subject] = append(bySubject[env.Subject], env.Type)
		dataOf[env.Type+" "+env.Subject] = env.Data
	}
	for _, info := range events.Types {
		if count[info.Type] == 0 {
			t.Errorf("no %s event", info.Type)
		}
	}
	for typ, want := range map[string]int{events.NodeRejoined: 1, events.NodeReady: 3, events.NodeRevoked: 1, events.NodeReattested: 1,
		events.GatewayUp: 2, events.GatewayDown: 2, events.TokenRevoked: 1, events.JoinTokenRevoked: 1, events.JoinTokenExpired: 1,
		events.GPUHealthChanged: 1, events.CommandCreated: 5, events.CommandSucceeded: 1, events.CommandFailed: 1} {
		if count[typ] != want {
			t.Errorf("%d %s events, want %d", count[typ], typ, want)
		}
	}
	wantSeq := []string{events.NodeJoined, events.NodeRejoined, events.NodeReady, events.NodeCordoned, events.NodeUncordoned, events.NodeClockSkewed,
		events.NodePoweredOff, events.NodeDrained, events.NodeReattested, events.NodeRevoked}
	if got := bySubject["node_ev1"]; !reflect.DeepEqual(got, wantSeq) {
		t.Errorf("node_ev1's events in order:\n got %v\nwant %v", got, wantSeq)
	}
	if got := bySubject["node_ev2"]; len(got) < 3 || got[2] != events.NodeUnreachable || got[len(got)-1] != events.NodeDeleted {
		t.Errorf("node_ev2's events: %v (want joined, ready, unreachable, ..., deleted)", got)
	}
	if got := bySubject["node_ev3"]; len(got) != 3 || got[2] != events.NodeUnresponsive {
		t.Errorf("node_ev3's events: %v (want joined, ready, unresponsive: its session is open)", got)
	}
	for key, want := range map[string]string{
		events.GPUHealthChanged + " GPU-ev": `{"nodeId":"node_ev2","gpuUuid":"GPU-ev","kind":"gpu.xid","severity":"critical","message":"XID 79","xid":79,` +
			`"finding":{"gpuUuid":"GPU-ev","xid":{"code":79}}}`,
		events.CommandFailed + " " + fail.ID: `{"commandId":"` + fail.ID + `","nodeId":"node_ev2","kind":"exec","batchId":"` + fail.BatchID +
			`","state":"failed","createdBy":"t","exitCode":1,"error":"exit status 1"}`,
		events.CommandSucceeded + " " + ok.ID: `{"commandId":"` + ok.ID + `","nodeId":"node_ev2","kind":"exec","batchId":"` + ok.BatchID +
			`","state":"succeeded","createdBy":"t","exitCode":0}`,
		events.NodeRolledBackLocally + " node_ev4": `{"nodeId":"node_ev4","poolId":"` + pool.ID + `","hostname":"node_ev4.example","fromVersion":"0.2.0",` +
			`"toVersion":"0.1.0","reason":"3 starts of 0.2.0 ended in an exit within 10m0s of the upgrade","starts":3,"rolledBackAt":"2026-12-01T10:00:00Z"}`,
		events.NodeUnreachable + " node_ev2": `{"nodeId":"node_ev2","poolId":"` + pool.ID + `","hostname":"node_ev2.example","state":"unreachable","previousState":"ready","cordoned":false}`,
		events.JoinTokenExhausted + " jt_ev1": `{"tokenId":"jt_ev1","poolId":"` + pool.ID + `","uses":1,"maxUses":1,"expiresAt":` +
			string(must(json.Marshal(jt.ExpiresAt.UTC()))) + `}`,
	} {
		if !jsonEqual(t, dataOf[key], []byte(want)) {
			t.Errorf("%s data:\n got %s\nwant %s", key, dataOf[key], want)
		}
	}
}

func typeInfo(typ string) (events.TypeInfo, bool) {
	for _, info := range events.Types {
		if info.Type == typ {
			return info, true
		}
	}
	return events.TypeInfo{}, false
}

// testDeadLetters moves entries to the dead-letter table, lists, counts,
// replays, fails and deletes them.
func testDeadLetters(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	var entries []*store.OutboxEntry
	for _, key := range []string{"a", "b", "c"} {
		must(st.OutboxInsert(ctx, "com.better-compute.test.x", key, []byte(`{"k":"`+key+`"}`)))
	}
	entries = must(st.OutboxList(ctx, 0, 10))
	for i, e := range entries {
		sink := "hook"
		if i == 2 {
			sink = "file"
		}
		tenant := ""
		if i == 1 {
			tenant = "ten_deadletter" // a tenant sink's: it carries the tenant it was for
		}
		check(t, st.DeadLetterInsert(ctx, &store.DeadLetter{Sink: sink, Entry: *e, Attempts: 10, LastError: "503", TenantID: tenant}))
	}
	check(t, st.DeadLetterInsert(ctx, &store.DeadLetter{Sink: "hook", Entry: *entries[0], Attempts: 10})) // again: no-op
	counts := must(st.DeadLetterCounts(ctx))
	if !reflect.DeepEqual(counts, map[string]int64{"hook": 2, "file": 1}) {
		t.Fatalf("counts = %v", counts)
	}
	hook := must(st.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: "hook"}))
	if len(hook) != 2 || hook[0].Entry.ID != entries[0].ID || hook[0].Entry.Key != "a" || hook[0].Attempts != 10 ||
		hook[0].LastError != "503" || hook[0].Replay || !jsonEqual(t, hook[0].Entry.Payload, entries[0].Payload) ||
		!hook[0].Entry.CreatedAt.Equal(entries[0].CreatedAt) || hook[0].FailedAt.IsZero() ||
		hook[0].TenantID != "" || hook[1].TenantID != "ten_deadletter" {
		t.Fatalf("hook's dead letters = %+v", hook)
	}
	if page := must(st.DeadLetterList(ctx, &store.DeadLetterListParams{AfterID: hook[0].ID, Limit: 1})); len(page) != 1 || page[0].ID != hook[1].ID {
		t.Fatalf("page after %d = %+v", hook[0].ID, page)
	}
	if n := must(st.DeadLetterReplay(ctx, "hook", []int64{hook[1].ID})); n != 1 {
		t.Fatalf("replayed %d, want 1", n)
	}
	if n := must(st.DeadLetterReplay(ctx, "file", []int64{hook[0].ID})); n != 0 {
		t.Fatalf("replayed %d of another sink's, want 0", n)
	}
	pending := must(st.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: "hook", Replay: true}))
	if len(pending) != 1 || pending[0].ID != hook[1].ID || pending[0].Attempts != 0 || !pending[0].Replay {
		t.Fatalf("pending replays = %+v", pending)
	}
	check(t, st.DeadLetterFailed(ctx, pending[0].ID, "still 503", 2))
	if p := must(st.DeadLetterList(ctx, &store.DeadLetterListParams{Replay: true})); len(p) != 1 || p[0].Attempts != 1 || p[0].LastError != "still 503" {
		t.Fatalf("after one failed replay = %+v", p)
	}
	check(t, st.DeadLetterFailed(ctx, pending[0].ID, "still 503", 2))
	if p := must(st.DeadLetterList(ctx, &store.DeadLetterListParams{Replay: true})); len(p) != 0 {
		t.Fatalf("replay still pending after max attempts: %+v", p)
	}
	if n := must(st.DeadLetterReplay(ctx, "", nil)); n != 3 {
		t.Fatalf("replay all = %d, want 3", n)
	}
	all := must(st.DeadLetterList(ctx, &store.DeadLetterListParams{Replay: true}))
	check(t, st.DeadLetterDelete(ctx, []int64{all[0].ID, all[1].ID}))
	if counts := must(st.DeadLetterCounts(ctx)); !reflect.DeepEqual(counts, map[string]int64{"file": 1}) {
		t.Fatalf("counts after delete = %v", counts)
	}
	wantErr(t, st.DeadLetterFailed(ctx, all[0].ID, "x", 2), store.ErrNotFound)
}
