package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// A listener whose port is taken names the flag that moves it; another
// error, or a port no flag names, passes through unchanged.
func TestPortInUseNamesTheFlag(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	_, err = net.Listen("tcp", addr)
	if err == nil {
		t.Fatal("a second listen on a port in use succeeded")
	}
	wrapped := fmt.Errorf("api listen on %s: %w", addr, err)
	got := portInUse(wrapped, listenFlag{"127.0.0.1:1", "use --other"}, listenFlag{addr, "use --port N"})
	if !errors.Is(got, wrapped) || !strings.HasSuffix(got.Error(), "; use --port N") {
		t.Errorf("portInUse = %v, want the error and the advice of --port", got)
	}
	if got := portInUse(wrapped, listenFlag{"127.0.0.1:1", "use --other"}); got != wrapped {
		t.Errorf("portInUse with no flag for the port = %v, want the error unchanged", got)
	}
	other := errors.New("boom")
	if got := portInUse(other, listenFlag{addr, "use --port N"}); got != other {
		t.Errorf("portInUse of another error = %v", got)
	}
}

// The waiting line of commands run names the nodes (at most
// maxWaitReportNodes) and their states.
func TestWaitingLine(t *testing.T) {
	pending := []*apiv1.Command{{NodeId: "node_a", State: "queued"}, {NodeId: "node_b", State: "running"}}
	if got, want := waitingLine(10*time.Second, 3, pending), "waited 10s for 2 of 3 node(s): node_a (queued), node_b (running)"; got != want {
		t.Errorf("waitingLine = %q, want %q", got, want)
	}
	var many []*apiv1.Command
	for i := range 12 {
		many = append(many, &apiv1.Command{NodeId: fmt.Sprintf("node_%d", i), State: "queued"})
	}
	if got := waitingLine(20*time.Second, 12, many); !strings.HasSuffix(got, "node_9 (queued) and 2 more") || strings.Contains(got, "node_10") {
		t.Errorf("waitingLine of 12 = %q, want 10 ids and \"and 2 more\"", got)
	}
}
