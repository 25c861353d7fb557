package tests

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestNodeEventFloodLogsLittle (issue 28): a node floods its session with
// events for 3 s (as fast as one connection carries them; the figure is
// logged), most beyond its write rate and so dropped. The control plane
// writes at most a few lines about that node meanwhile: one per kind a
// minute (host.gateway.nodeLogInterval), not one per dropped event.
// A command run on the node afterwards is the signal that the gateway
// handled every event before it (a session's messages are handled in
// order).
func TestNodeEventFloodLogsLittle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeployment(t, backendSQLite)
	file, _ := d.joinToken(1, time.Hour)
	tok, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "flood-01", Session: session.Config{StartJitter: -1}})
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
	node := fd.NodeID()
	bad := &sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{Kind: "flood.bad", Time: timestamppb.Now(),
		Severity: sessionv1.Severity_SEVERITY_WARNING, Message: "bad"}}}
	eventually(t, 30*time.Second, func() bool { return fd.Send(bad) == nil },
		func() string { return "the simulated node never held a session" })
	d.serve.WaitLine(`msg="Session opened" .*node_id=`+node, 30*time.Second)
	before := len(strings.Split(d.serve.Output(), "\n"))

	sent := 0
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		if err := fd.Send(bad); err != nil {
			t.Fatalf("send event %d: %v", sent, err)
		}
		sent++
	}
	elapsed := time.Since(start)
	// The signal: a command's result comes after every event sent.
	code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, d.viaAPI("--config", d.cfgFile, "commands", "run", "--node", node, "--", "true")...)
	if code != 0 {
		t.Fatalf("commands run after the flood: exit %d\n%s%s", code, stdout, stderr)
	}
	lines := strings.Split(d.serve.Output(), "\n")[before:]
	var about []string
	for _, l := range lines {
		if strings.Contains(l, node) {
			about = append(about, l)
		}
	}
	t.Logf("the node sent %d events in %s (%.0f a second); serve wrote %d lines about it", sent, elapsed.Round(time.Millisecond),
		float64(sent)/elapsed.Seconds(), len(about))
	for _, l := range about {
		t.Log(l)
	}
	if len(about) > 5 {
		t.Fatalf("serve wrote %d lines about node %s during its flood of %d events: want at most a few", len(about), node, sent)
	}
}
