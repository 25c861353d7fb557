package queries

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// event is one event to write to the outbox.
type event struct {
	typ, subject string
	data         any
}

// timedEvent is an event and the time its change happened.
type timedEvent struct {
	event
	at time.Time
}

// emit writes events to the outbox in s's transaction (its caller's, or
// one of its own), as CloudEvents envelopes timed now (the time the caller
// passed, else the process's clock). The transaction takes the outbox
// write lock at once, and the events of every emit in it are written
// together in multi-row inserts just before the commit (flushEvents), so
// they come last in the transaction and a batch of changes costs a few
// statements, not one per event.
func (s *Store) emit(ctx context.Context, now *time.Time, evs ...event) error {
	if len(evs) == 0 {
		return nil
	}
	t := time.Now()
	if now != nil {
		t = *now
	}
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if err := q.outboxWrite(ctx); err != nil {
			return err
		}
		for _, e := range evs {
			*q.pending = append(*q.pending, timedEvent{e, t})
		}
		return nil
	})
}

// flushEvents writes the transaction's pending events to the outbox, in
// the order they were emitted.
func (s *Store) flushEvents(ctx context.Context) error {
	evs := *s.pending
	*s.pending = nil
	for start := 0; start < len(evs); start += enqueueChunk {
		chunk := evs[start:min(start+enqueueChunk, len(evs))]
		args := make([]any, 0, 3*len(chunk))
		var values strings.Builder
		for i, e := range chunk {
			env, err := events.New(e.typ, e.subject, e.data, e.at)
			if err != nil {
				return err
			}
			b, err := env.Marshal()
			if err != nil {
				return err
			}
			if i > 0 {
				values.WriteString(", ")
			}
			n := len(args)
			fmt.Fprintf(&values, "($%d, $%d, $%d, now())", n+1, n+2, n+3)
			args = append(args, e.typ, e.subject, JSON(b))
		}
		if _, err := s.db.Exec(ctx, `INSERT INTO outbox (topic, key, payload, created_at) VALUES `+values.String(), args...); err != nil {
			return s.wrap("write events", err)
		}
	}
	return nil
}

// nodeEvent is the event of node n as a change left it.
func nodeEvent(typ string, n *nodeRow) event {
	return event{typ, n.id, events.NodeData{NodeID: n.id, PoolID: n.poolID, Hostname: n.hostname, State: n.state,
		PreviousState: n.previous, Cordoned: n.cordoned, JoinTokenID: n.joinTokenID}}
}

// nodeRow is what a node event says of a node.
type nodeRow struct {
	id, poolID, hostname, state, previous, joinTokenID string
	cordoned                                           bool
}

// lockNode reads a node's event fields, locking its row for the change
// that follows (store.ErrNotFound when it does not exist).
func (s *Store) lockNode(ctx context.Context, id string) (*nodeRow, error) {
	n := &nodeRow{id: id}
	err := s.db.QueryRow(ctx, `SELECT pool_id, hostname, state, cordoned FROM nodes WHERE id = $1`+s.d.ForUpdate, id).
		Scan(&n.poolID, &n.hostname, &n.state, &n.cordoned)
	if err != nil {
		return nil, s.wrap("get node "+id, err)
	}
	return n, nil
}

// nodeStateEvents maps a node state to the event a move into it writes.
var nodeStateEvents = map[string]string{
	store.NodeReady:       events.NodeReady,
	store.NodeUnreachable: events.NodeUnreachable,
	store.NodePoweredOff:  events.NodePoweredOff,
	store.NodeDraining:    events.NodeDrained,
	store.NodeClockSkewed: events.NodeClockSkewed,
}

// commandEvent is a command's event as it now is.
func commandEvent(typ string, c *store.Command) event {
	return event{typ, c.ID, events.CommandData{CommandID: c.ID, NodeID: c.NodeID, Kind: c.Kind, BatchID: c.BatchID,
		State: c.State, CreatedBy: c.CreatedBy, ExitCode: c.ExitCode, Error: c.Error}}
}

// commandEvents are the terminal events of commands.
func commandEvents(cmds []*store.Command) []event {
	out := make([]event, 0, len(cmds))
	for _, c := range cmds {
		if typ := events.CommandTerminal(c.State); typ != "" {
			out = append(out, commandEvent(typ, c))
		}
	}
	return out
}

// joinTokenEvent is a join token's event.
func joinTokenEvent(typ string, t *store.JoinToken) event {
	return event{typ, t.ID, events.JoinTokenData{TokenID: t.ID, PoolID: t.PoolID, Uses: t.Uses, MaxUses: t.MaxUses,
		ExpiresAt: t.ExpiresAt.UTC(), NodeID: t.NodeID}}
}
