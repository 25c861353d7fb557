package gateway

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
)

func TestWarnNodeOncePerIntervalWithCount(t *testing.T) {
	var buf bytes.Buffer
	clk := clocktest.New(time.Unix(1000, 0))
	g := &Gateway{cfg: Config{Clock: clk, NodeLogInterval: time.Minute},
		log: slog.New(slog.NewTextHandler(&buf, nil))}
	s := &session{nodeID: "node_a"}
	ctx := context.Background()
	for range 1000 {
		g.warnNode(ctx, s, "Event dropped: too many writes", "kind", "x")
		g.warnNode(ctx, s, "Inventory dropped: too many writes")
	}
	clk.Advance(time.Minute)
	g.warnNode(ctx, s, "Event dropped: too many writes", "kind", "x")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("wrote %d lines, want 3 (one per kind, then one a minute later):\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[2], "dropped=999") || !strings.Contains(lines[2], "node_id=node_a") {
		t.Fatalf("the line a minute later = %s, want the 999 dropped counted", lines[2])
	}
}
