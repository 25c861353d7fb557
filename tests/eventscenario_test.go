package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sinks"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// envelopeReceiver is a webhook endpoint that checks every request's
// signature and parses every envelope of its batch with events.Parse,
// keeping them in the order they arrived (a redelivered id once, where it
// first came).
type envelopeReceiver struct {
	secret []byte

	mu   sync.Mutex
	bad  []string
	seen map[string]bool
	got  []*events.Envelope
}

func (r *envelopeReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	ts, _ := strconv.ParseInt(req.Header.Get(sinks.HeaderTimestamp), 10, 64)
	var batch []json.RawMessage
	switch {
	case err != nil:
		r.bad = append(r.bad, "read body: "+err.Error())
	case !sinks.Verify(r.secret, ts, body, req.Header.Get(sinks.HeaderSignature)):
		r.bad = append(r.bad, "signature does not verify over "+string(body))
	case json.Unmarshal(body, &batch) != nil:
		r.bad = append(r.bad, "body "+string(body))
	default:
		for _, m := range batch {
			e, err := events.Parse(m)
			if err != nil {
				r.bad = append(r.bad, fmt.Sprintf("%v: %s", err, m))
				continue
			}
			if !r.seen[e.ID] {
				r.seen[e.ID] = true
				r.got = append(r.got, e)
			}
		}
		return
	}
	w.WriteHeader(http.StatusBadRequest)
}

// about returns, in arrival order, the events about node: its own (subject
// node) and its commands' and GPUs' (data.nodeId node).
func (r *envelopeReceiver) about(node string) []*events.Envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*events.Envelope
	for _, e := range r.got {
		var data struct {
			NodeID string `json:"nodeId"`
		}
		_ = json.Unmarshal(e.Data, &data)
		if e.Subject == node || data.NodeID == node {
			out = append(out, e)
		}
	}
	return out
}

// types are the envelopes' types without events.TypePrefix.
func types(evs []*events.Envelope) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = strings.TrimPrefix(e.Type, events.TypePrefix)
	}
	return out
}

// subsequence reports whether want appears in got in order (other entries
// between them allowed).
func subsequence(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestEventScenarioWebhook is issue 18's first Done-when scenario, on both
// backends (the embedded SQLite default and PostgreSQL) with real
// processes: a webhook sink (an httptest server here)
// receives, in order per node, the events of a real bcd that joins, runs a
// command, is cordoned, is killed (unreachable; heartbeats every second) and
// comes back (ready), and a GPU of a simulated node (a FakeDaemon) raising
// XID 79. Every request's signature verifies and every envelope parses with
// events.Parse; the node's events arrive in outbox order (events.list's ids).
func TestEventScenarioWebhook(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testEventScenarioWebhook)
}

func testEventScenarioWebhook(t *testing.T, backend string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	recv := &envelopeReceiver{secret: []byte("e2e-scenario-signing-secret"), seen: map[string]bool{}}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	d := newDeploymentWith(t, backend, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top: fmt.Sprintf("sinks:\n  webhooks:\n    - name: scenario\n      url: %s/hook\n      secret: %s\n",
			srv.URL, recv.secret),
	})

	// A real bcd joins and is ready.
	tokenFile, _ := d.joinToken(2, time.Hour)
	m := newMachine(t, "scenario-01")
	node := m.mustJoin(d.gatewayURL, tokenFile)
	bcd := m.node()
	bcd.WaitLine(sessionEstablished.String(), 30*time.Second)
	state := func(want string) {
		t.Helper()
		eventually(t, 30*time.Second, func() bool { return d.nodes()[node].State == want },
			func() string { return fmt.Sprintf("node %s is %+v, want %s", node, d.nodes()[node], want) })
	}
	state("ready")

	// It runs a command.
	cmd := d.runNoWait(node, nil, "true")
	eventually(t, 30*time.Second, func() bool { return d.command(cmd).State == "succeeded" },
		func() string { return fmt.Sprintf("command %s: %+v", cmd, d.command(cmd)) })

	// It is cordoned, killed (unreachable once three 1 s heartbeats are
	// missed and liveness runs), and comes back.
	d.cli(d.viaAPI("nodes", "cordon", node)...)
	bcd.Kill()
	killed := time.Now()
	state("unreachable")
	t.Logf("unreachable %v after kill -9 of bcd node", time.Since(killed).Round(time.Millisecond))
	again := m.node()
	again.WaitLine(sessionEstablished.String(), 30*time.Second)
	state("ready")

	// A simulated node's GPU raises XID 79 (fallen off the bus).
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "scenario-sim-01", Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fd.Join(ctx, d.gatewayURL, strings.TrimSpace(string(tok))); err != nil {
		t.Fatal(err)
	}
	simCtx, stopSim := context.WithCancel(ctx)
	simDone := make(chan error, 1)
	go func() { simDone <- fd.Run(simCtx) }()
	t.Cleanup(func() { stopSim(); <-simDone })
	gpu := fd.Inventory().GetGpus()[0].GetUuid()
	xid := &sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{Kind: "gpu.xid", Time: timestamppb.Now(),
		Severity: sessionv1.Severity_SEVERITY_CRITICAL, GpuUuid: gpu, Xid: 79, Message: "GPU has fallen off the bus"}}}
	eventually(t, 30*time.Second, func() bool { return fd.Send(xid) == nil },
		func() string { return "the simulated node never held a session to send its XID on" })

	// The sink receives the node's events in order, and the GPU's.
	want := []string{"node.joined", "node.ready", "command.created", "command.succeeded", "node.cordoned", "node.unreachable", "node.ready"}
	var got []*events.Envelope
	eventually(t, 60*time.Second, func() bool {
		got = recv.about(node)
		return subsequence(types(got), want)
	}, func() string {
		return fmt.Sprintf("node %s: the sink received %v, want %v in this order", node, types(got), want)
	})
	var gpuEvent *events.Envelope
	eventually(t, 30*time.Second, func() bool {
		for _, e := range recv.about(fd.NodeID()) {
			if e.Type == events.GPUHealthChanged && e.Subject == gpu {
				gpuEvent = e
				return true
			}
		}
		return false
	}, func() string {
		return fmt.Sprintf("no %s about %s: the sink received %v for %s", events.GPUHealthChanged, gpu, types(recv.about(fd.NodeID())), fd.NodeID())
	})
	var health events.GPUHealthData
	if err := json.Unmarshal(gpuEvent.Data, &health); err != nil {
		t.Fatal(err)
	}
	if health.NodeID != fd.NodeID() || health.GPUUUID != gpu || health.Kind != "gpu.xid" || health.XID != 79 || health.Severity != "critical" {
		t.Fatalf("gpu event data %s", gpuEvent.Data)
	}

	// In outbox order: the ids events.list gives them only grow.
	admin := &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}
	outboxID := map[string]int64{}
	for cursor := ""; ; {
		page, err := admin.EventsList(ctx, &apiv1.ListEventsRequest{Page: &apiv1.Page{Cursor: cursor, Limit: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			id, _ := strconv.ParseInt(e.Id, 10, 64)
			outboxID[e.GetCloudEvent().GetFields()["id"].GetStringValue()] = id
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	var order []int64
	for _, e := range got {
		if outboxID[e.ID] == 0 {
			t.Fatalf("event %s (%s) is not in events.list", e.ID, e.Type)
		}
		order = append(order, outboxID[e.ID])
	}
	if !slices.IsSorted(order) {
		t.Fatalf("node %s's events arrived out of outbox order: %v (%v)", node, order, types(got))
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Fatalf("%d requests or envelopes refused, the first: %s", len(recv.bad), recv.bad[0])
	}
	t.Logf("node %s: %v; gpu %s: %s", node, types(got), gpu, gpuEvent.Data)
}
