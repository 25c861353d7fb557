package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// DefaultNodeLogInterval is the default of Config.NodeLogInterval: at most
// one log line a minute per kind about one node (issue 28: a node sending
// 100,000 bad events a second made the control plane log ~9 MB a second).
const DefaultNodeLogInterval = time.Minute

// maxNoteKinds bounds the kinds a session's notes remember; kinds are the
// gateway's own messages, so this is never reached in practice.
const maxNoteKinds = 32

// note is how one kind of line about a session's node was last logged.
type note struct {
	next    time.Time // when the next line of the kind may be written
	dropped int       // lines not written since the last one
}

// nodeNotes limits the log lines about one session's node: at most one
// each interval per kind (the log message), the next one carrying the
// count of those dropped in between. Handler goroutine only.
type nodeNotes map[string]*note

// warnNode logs msg about s's node at warning level, unless a line of msg
// about it was written less than NodeLogInterval ago; the lines dropped
// meanwhile are counted in the next one's "dropped" attribute.
func (g *Gateway) warnNode(ctx context.Context, s *session, msg string, args ...any) {
	now := g.cfg.Clock.Now()
	if s.notes == nil {
		s.notes = nodeNotes{}
	}
	n := s.notes[msg]
	if n == nil {
		if len(s.notes) >= maxNoteKinds {
			return
		}
		n = &note{}
		s.notes[msg] = n
	}
	if now.Before(n.next) {
		n.dropped++
		return
	}
	n.next = now.Add(g.cfg.NodeLogInterval)
	attrs := append([]any{logkey.NodeID, s.nodeID}, args...)
	if n.dropped > 0 {
		attrs = append(attrs, "dropped", n.dropped)
		n.dropped = 0
	}
	g.log.Log(ctx, slog.LevelWarn, msg, attrs...)
}
