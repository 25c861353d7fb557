package queries

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

const commandColumns = `id, node_id, kind, spec, state, coalesce(idempotency_key, ''), batch_id, created_by, attempt,
	gateway_id, exit_code, error, output_truncated, output_bytes, result, cancel_requested, created_at, deadline_at,
	dispatched_at, started_at, finished_at, session_spec`

// commandEventColumns are the columns a command's events tell (see
// commandEvent): a terminal result reads back only these, not the spec
// and result, which a batch of a thousand results would otherwise move.
const commandEventColumns = `id, node_id, kind, batch_id, state, created_by, exit_code, error`

func scanCommandEvent(r Row) (*store.Command, error) {
	c := &store.Command{}
	if err := r.Scan(&c.ID, &c.NodeID, &c.Kind, &c.BatchID, &c.State, &c.CreatedBy, &c.ExitCode, &c.Error); err != nil {
		return nil, err
	}
	return c, nil
}

func scanCommand(r Row) (*store.Command, error) {
	c := &store.Command{}
	var legacy []byte
	err := r.Scan(&c.ID, &c.NodeID, &c.Kind, &legacy, &c.State, &c.IdempotencyKey, &c.BatchID, &c.CreatedBy,
		&c.Attempt, &c.GatewayID, &c.ExitCode, &c.Error, &c.OutputTruncated, &c.OutputBytes, &c.Result,
		&c.CancelRequested, &c.CreatedAt, &c.DeadlineAt, &c.DispatchedAt, &c.StartedAt, &c.FinishedAt, &c.SessionSpec)
	if err != nil {
		return c, err
	}
	if c.SessionSpec == nil {
		// Written by a build older than migration 0008 (during a rolling
		// deploy): convert as the migration does.
		c.SessionSpec, err = legacySessionSpec(c.Kind, legacy)
	}
	return c, err
}

// legacySessionSpec converts the spec column's form (the API's ExecSpec,
// PowerSpec, BootSpec or UpgradeSpec as protojson, "{}" for kinds without
// a spec) to the session-protocol form, as migration
// 0008_command_session_spec does in SQL: the JSON names of those API
// messages are the session messages' own, so the spec becomes the value of
// the oneof field its kind takes, and a power.* spec gains its action.
// Goes with the spec column at the contract step.
func legacySessionSpec(kind string, spec []byte) ([]byte, error) {
	field := ""
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(spec, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("command spec of kind %s is not a JSON object: %.80q", kind, spec)
	}
	switch action, power := sessionv1.PowerAction(kind); {
	case power:
		field = "power"
		a, _ := json.Marshal(action)
		obj["action"] = a
	case kind == sessionv1.KindExec:
		field = "exec"
	case kind == sessionv1.KindBootSet:
		field = "boot"
	case kind == sessionv1.KindUpgrade:
		field = "upgrade"
	default:
		return []byte("{}"), nil
	}
	return json.Marshal(map[string]any{field: obj})
}

// legacySpec derives the spec column's form from the session-protocol form
// (the oneof field's value alone, "{}" without one), which a gateway of a
// build older than migration 0008 reads. Goes with the spec column at the
// contract step.
func legacySpec(sessionSpec []byte) ([]byte, error) {
	if sessionSpec == nil {
		return []byte("{}"), nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(sessionSpec, &obj); err != nil || obj == nil || len(obj) > 1 {
		return nil, fmt.Errorf("session spec is not a JSON object with at most one field: %.80q", sessionSpec)
	}
	for _, v := range obj {
		return v, nil
	}
	return []byte("{}"), nil
}

// terminalStates is the SQL list of terminal states.
const terminalStates = `('succeeded', 'failed', 'cancelled', 'expired', 'lost')`

// enqueueChunk bounds the rows of one multi-row INSERT (PostgreSQL allows
// 65,535 parameters).
const enqueueChunk = 1000

// CommandEnqueue writes one command per node plus an outbox row, in one
// transaction, with multi-row inserts.
func (s *Store) CommandEnqueue(ctx context.Context, p *store.CommandEnqueueParams) ([]*store.Command, error) {
	if len(p.NodeIDs) == 0 {
		return nil, nil
	}
	batch := p.BatchID
	if batch == "" {
		batch = store.NewID("batch")
	}
	var idem any
	if p.IdempotencyKey != "" {
		idem = p.IdempotencyKey
	}
	now := s.clock(p.Now)
	sessionSpec := p.SessionSpec
	if sessionSpec == nil {
		sessionSpec = []byte("{}")
	}
	legacy, err := legacySpec(sessionSpec)
	if err != nil {
		return nil, fmt.Errorf("enqueue commands: %w", err)
	}
	var out []*store.Command
	err = s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		nodes := p.NodeIDs
		if p.IdempotencyKey != "" {
			existing, err := q.commandsByKey(ctx, p.IdempotencyKey, nodes)
			if err != nil {
				return err
			}
			if p.KeyOfCreator {
				for _, c := range existing {
					if c.CreatedBy != p.CreatedBy {
						return fmt.Errorf("%w: idempotency key %q is already used on node %s by another caller", store.ErrConflict, p.IdempotencyKey, c.NodeID)
					}
				}
			}
			if len(existing) > 0 {
				seen := map[string]bool{}
				for _, c := range existing {
					seen[c.NodeID] = true
				}
				out = append(out, existing...)
				nodes = nil
				for _, n := range p.NodeIDs {
					if !seen[n] {
						nodes = append(nodes, n)
					}
				}
			}
		}
		var created []event // one command.created per new command, not for idempotent repeats
		for start := 0; start < len(nodes); start += enqueueChunk {
			chunk := nodes[start:min(start+enqueueChunk, len(nodes))]
			args := []any{p.Kind, JSON(legacy), idem, batch, p.CreatedBy, now, p.Timeout.Microseconds(), JSON(sessionSpec)}
			var values strings.Builder
			for i, node := range chunk {
				if i > 0 {
					values.WriteString(", ")
				}
				n := len(args)
				fmt.Fprintf(&values, "($%d, $%d, $1, $2, $8, 'queued', $3, $4, $5, coalesce($6, now()), coalesce($6, now()) + bc_micros($7))", n+1, n+2)
				args = append(args, store.NewID("cmd"), node)
			}
			rows, err := q.db.Query(ctx, `INSERT INTO commands
				(id, node_id, kind, spec, session_spec, state, idempotency_key, batch_id, created_by, created_at, deadline_at)
				VALUES `+values.String()+` RETURNING `+commandColumns, args...)
			if err != nil {
				return q.wrap("enqueue commands", err)
			}
			cmds, err := collect(rows, scanCommand)
			if err != nil {
				return q.wrap("enqueue commands", err)
			}
			out = append(out, cmds...)
			for _, c := range cmds {
				created = append(created, commandEvent(events.CommandCreated, c))
			}
		}
		return q.emit(ctx, now, created...)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Store) commandsByKey(ctx context.Context, key string, nodes []string) ([]*store.Command, error) {
	in, ids := s.textSet("$2", nodes)
	rows, err := s.db.Query(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE idempotency_key = $1 AND node_id IN (`+in+`)`, key, ids)
	if err != nil {
		return nil, s.wrap("find idempotent commands", err)
	}
	out, err := collect(rows, scanCommand)
	return out, s.wrap("find idempotent commands", err)
}

// CommandGet returns a command.
func (s *Store) CommandGet(ctx context.Context, id string) (*store.Command, error) {
	c, err := scanCommand(s.db.QueryRow(ctx, `SELECT `+commandColumns+` FROM commands WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get command "+id, err)
	}
	return c, nil
}

// CommandList pages commands by id.
func (s *Store) CommandList(ctx context.Context, p *store.CommandListParams) ([]*store.Command, error) {
	rows, err := s.db.Query(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE id > $1 AND ($2 = '' OR node_id = $2) AND ($3 = '' OR batch_id = $3) AND ($4 = '' OR state = $4)
			AND ($6 = '' OR node_id IN (SELECT n.id FROM nodes n JOIN pools p ON p.id = n.pool_id WHERE `+withinTenant("p.tenant_id", 6)+`))
		ORDER BY id LIMIT $5`, p.Cursor, p.NodeID, p.BatchID, p.State, limit(p.Limit), p.Within)
	if err != nil {
		return nil, s.wrap("list commands", err)
	}
	out, err := collect(rows, scanCommand)
	return out, s.wrap("list commands", err)
}

// CommandSetState moves a live command between non-terminal states.
func (s *Store) CommandSetState(ctx context.Context, p *store.CommandSetStateParams) (bool, error) {
	if store.IsTerminal(p.State) {
		return false, fmt.Errorf("set command state: %q is terminal, use CommandFinish", p.State)
	}
	n, err := s.db.Exec(ctx, `UPDATE commands SET state = $2,
			gateway_id = CASE WHEN $3 = '' THEN gateway_id ELSE $3 END,
			attempt = CASE WHEN $2 = 'dispatched' THEN attempt + 1 ELSE attempt END,
			dispatched_at = CASE WHEN $2 = 'dispatched' THEN coalesce($4, now()) ELSE dispatched_at END,
			started_at = CASE WHEN $2 = 'running' THEN coalesce(started_at, coalesce($4, now())) ELSE started_at END
		WHERE id = $1 AND ($5 = '' OR node_id = $5) AND state NOT IN `+terminalStates, p.ID, p.State, p.GatewayID, p.Now, p.NodeID)
	if err != nil {
		return false, s.wrap("set state of command "+p.ID, err)
	}
	if n == 0 {
		return false, s.commandExists(ctx, p.ID)
	}
	return true, nil
}

// CommandFinish records the first terminal result.
func (s *Store) CommandFinish(ctx context.Context, p *store.CommandFinishParams) (bool, error) {
	if !store.IsTerminal(p.State) {
		return false, fmt.Errorf("finish command: %q is not terminal", p.State)
	}
	var result any
	if p.Result != nil {
		result = JSON(p.Result)
	}
	var done bool
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		rows, err := q.db.Query(ctx, `UPDATE commands SET state = $2, exit_code = $3, error = $4, output_truncated = output_truncated OR $5,
				result = $6, finished_at = coalesce($7, now()),
				started_at = coalesce(started_at, dispatched_at)
			WHERE id = $1 AND ($8 = '' OR node_id = $8) AND state NOT IN `+terminalStates+` RETURNING `+commandEventColumns,
			p.ID, p.State, p.ExitCode, p.Error, p.OutputTruncated, result, p.Now, p.NodeID)
		if err != nil {
			return q.wrap("finish command "+p.ID, err)
		}
		cmds, err := collect(rows, scanCommandEvent)
		if err != nil {
			return q.wrap("finish command "+p.ID, err)
		}
		if len(cmds) == 0 {
			return q.commandExists(ctx, p.ID)
		}
		done = true
		return q.emit(ctx, p.Now, commandEvents(cmds)...)
	})
	return done, err
}

func (s *Store) commandExists(ctx context.Context, id string) error {
	var one int
	err := s.db.QueryRow(ctx, `SELECT 1 FROM commands WHERE id = $1`, id).Scan(&one)
	return s.wrap("get command "+id, err)
}

// CommandAppendOutput stores an output chunk once, within the command's
// output limit and only while the command is not terminal.
func (s *Store) CommandAppendOutput(ctx context.Context, c *store.CommandOutputChunk) (int, error) {
	var kept int
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		kept = 0
		var (
			state, kind  string
			have         int64
			truncated    bool
			spec, legacy []byte
		)
		err := q.db.QueryRow(ctx, `SELECT state, kind, output_bytes, output_truncated, session_spec, spec FROM commands
			WHERE id = $1 AND ($2 = '' OR node_id = $2)`, c.CommandID, c.NodeID).Scan(&state, &kind, &have, &truncated, &spec, &legacy)
		if err != nil {
			if err = q.wrap("append output of command "+c.CommandID, err); errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		}
		if store.IsTerminal(state) {
			return nil
		}
		limit, err := outputLimit(kind, spec, legacy)
		if err != nil {
			return q.wrap("append output of command "+c.CommandID, err)
		}
		data := c.Data
		if room := max(0, min(limit-have, store.MaxOutputChunk)); int64(len(data)) > room {
			data = data[:room]
		}
		cut := len(data) < len(c.Data)
		if len(data) > 0 {
			n, err := q.db.Exec(ctx, `INSERT INTO command_output (command_id, seq, stream, data) VALUES ($1, $2, $3, $4)
				ON CONFLICT (command_id, seq) DO NOTHING`, c.CommandID, c.Seq, c.Stream, data)
			if err != nil {
				return q.wrap("append output of command "+c.CommandID, err)
			}
			if n == 0 {
				return nil // a redelivery
			}
			kept = len(data)
		}
		if kept == 0 && (!cut || truncated) {
			// Nothing changes: no write (a node sending on past its
			// limit must not churn the command's row either).
			return nil
		}
		_, err = q.db.Exec(ctx, `UPDATE commands SET output_bytes = output_bytes + $2, output_truncated = output_truncated OR $3
			WHERE id = $1`, c.CommandID, int64(kept), cut)
		return q.wrap("append output of command "+c.CommandID, err)
	})
	return kept, err
}

// outputLimit is the most output a command keeps: its exec spec's
// outputLimitBytes, else sessionv1.DefaultOutputLimitBytes.
func outputLimit(kind string, spec, legacy []byte) (int64, error) {
	if kind != sessionv1.KindExec {
		return sessionv1.DefaultOutputLimitBytes, nil
	}
	if spec == nil {
		var err error
		if spec, err = legacySessionSpec(kind, legacy); err != nil {
			return 0, err
		}
	}
	var c sessionv1.Command
	if err := sessionv1.UnmarshalSpec(spec, &c); err != nil {
		return 0, err
	}
	if n := c.GetExec().GetOutputLimitBytes(); n > 0 {
		return int64(n), nil
	}
	return sessionv1.DefaultOutputLimitBytes, nil
}

// CommandOutputPage reads one page of a command's output: the page's last
// sequence number is found from the chunks' lengths alone, so only the
// page's data is read.
func (s *Store) CommandOutputPage(ctx context.Context, p *store.CommandOutputPageParams) (*store.CommandOutputPage, error) {
	maxBytes := p.MaxBytes
	if maxBytes <= 0 || maxBytes > store.MaxOutputPage {
		maxBytes = store.MaxOutputPage
	}
	what := "read output of command " + p.CommandID
	var last *int64
	err := s.db.QueryRow(ctx, `SELECT max(seq) FROM (SELECT seq, sum(length(data)) OVER (ORDER BY seq) AS upto
			FROM command_output WHERE command_id = $1 AND seq > $2) page WHERE upto <= $3`,
		p.CommandID, p.AfterSeq, maxBytes).Scan(&last)
	if err != nil {
		return nil, s.wrap(what, err)
	}
	var rows Rows
	if last != nil {
		rows, err = s.db.Query(ctx, `SELECT command_id, seq, stream, data FROM command_output
			WHERE command_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq`, p.CommandID, p.AfterSeq, *last)
	} else {
		// The next chunk alone is over maxBytes (a caller's smaller
		// page): it is the page.
		rows, err = s.db.Query(ctx, `SELECT command_id, seq, stream, data FROM command_output
			WHERE command_id = $1 AND seq > $2 ORDER BY seq LIMIT 1`, p.CommandID, p.AfterSeq)
	}
	if err != nil {
		return nil, s.wrap(what, err)
	}
	chunks, err := collect(rows, func(r Row) (*store.CommandOutputChunk, error) {
		c := &store.CommandOutputChunk{}
		return c, r.Scan(&c.CommandID, &c.Seq, &c.Stream, &c.Data)
	})
	if err != nil {
		return nil, s.wrap(what, err)
	}
	page := &store.CommandOutputPage{Chunks: chunks}
	if len(chunks) > 0 {
		err = s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM command_output WHERE command_id = $1 AND seq > $2)`,
			p.CommandID, chunks[len(chunks)-1].Seq).Scan(&page.More)
		if err != nil {
			return nil, s.wrap(what, err)
		}
	}
	return page, nil
}

// CommandPrune deletes terminal commands finished before before.
func (s *Store) CommandPrune(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM commands WHERE state IN `+terminalStates+` AND finished_at < $1`, before)
	return n, s.wrap("prune commands", err)
}

// CommandRequestCancel cancels a queued command at once and marks a live
// one for its gateway.
func (s *Store) CommandRequestCancel(ctx context.Context, id string) (*store.Command, error) {
	var out *store.Command
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		rows, err := q.db.Query(ctx, `UPDATE commands SET state = 'cancelled', cancel_requested = true,
				error = 'cancelled before dispatch', finished_at = now()
			WHERE id = $1 AND state = 'queued' RETURNING `+commandColumns, id)
		if err != nil {
			return q.wrap("cancel command "+id, err)
		}
		cancelled, err := collect(rows, scanCommand)
		if err != nil {
			return q.wrap("cancel command "+id, err)
		}
		if err := q.emit(ctx, nil, commandEvents(cancelled)...); err != nil {
			return err
		}
		if _, err := q.db.Exec(ctx, `UPDATE commands SET cancel_requested = true
			WHERE id = $1 AND state NOT IN `+terminalStates, id); err != nil {
			return q.wrap("cancel command "+id, err)
		}
		c, err := q.CommandGet(ctx, id)
		out = c
		return err
	})
	return out, err
}

// inFlightStates is the SQL list of states in which a node holds a command.
const inFlightStates = `('dispatched', 'accepted', 'running')`

// CommandSweep expires overdue commands and loses or re-queues orphaned ones.
func (s *Store) CommandSweep(ctx context.Context, p *store.CommandSweepParams) (*store.CommandSweepResult, error) {
	now := s.clock(p.Now)
	res := &store.CommandSweepResult{}
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var err error
		res.Expired, err = q.sweepQuery(ctx, `UPDATE commands SET state = 'expired', error = 'deadline passed before a result',
				finished_at = coalesce($1, now())
			WHERE state NOT IN `+terminalStates+` AND deadline_at <= coalesce($1, now())
			RETURNING `+commandColumns, now)
		if err != nil {
			return err
		}
		orphaned := `state IN ` + inFlightStates + ` AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.node_id = commands.node_id)
			AND (SELECT coalesce(n.last_seen_at, n.created_at) FROM nodes n WHERE n.id = commands.node_id) <= coalesce($1, now()) - bc_micros($2)`
		res.Requeued, err = q.sweepQuery(ctx, `UPDATE commands SET state = 'queued', gateway_id = ''
			WHERE idempotency_key IS NOT NULL AND NOT cancel_requested AND `+orphaned+` RETURNING `+commandColumns,
			now, p.LostAfter.Microseconds())
		if err != nil {
			return err
		}
		res.Lost, err = q.sweepQuery(ctx, `UPDATE commands SET state = 'lost', error = 'the node lost its session while holding the command',
				finished_at = coalesce($1, now())
			WHERE `+orphaned+` RETURNING `+commandColumns, now, p.LostAfter.Microseconds())
		if err != nil {
			return err
		}
		return q.emit(ctx, now, append(commandEvents(res.Expired), commandEvents(res.Lost)...)...)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (s *Store) sweepQuery(ctx context.Context, sql string, args ...any) ([]*store.Command, error) {
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, s.wrap("sweep commands", err)
	}
	out, err := collect(rows, scanCommand)
	return out, s.wrap("sweep commands", err)
}

// CommandClaim moves queued commands of this gateway's sessions to
// dispatched.
func (s *Store) CommandClaim(ctx context.Context, p *store.CommandClaimParams) ([]*store.Command, error) {
	now := s.clock(p.Now)
	rows, err := s.db.Query(ctx, `UPDATE commands SET state = 'dispatched', gateway_id = $1, attempt = attempt + 1,
			dispatched_at = coalesce($3, now())
		WHERE id IN (SELECT c.id FROM commands c JOIN sessions x ON x.node_id = c.node_id
			WHERE c.state = 'queued' AND x.gateway_id = $1 AND c.deadline_at > coalesce($3, now())
			ORDER BY c.created_at, c.id LIMIT $2`+s.d.SkipLocked+`)
		RETURNING `+commandColumns, p.GatewayID, limit(p.Limit), now)
	if err != nil {
		return nil, s.wrap("claim commands", err)
	}
	out, err := collect(rows, scanCommand)
	return out, s.wrap("claim commands", err)
}

// CommandInFlight returns the commands a node may hold.
func (s *Store) CommandInFlight(ctx context.Context, nodeID string) ([]*store.Command, error) {
	rows, err := s.db.Query(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE node_id = $1 AND state IN `+inFlightStates+` ORDER BY created_at, id`, nodeID)
	if err != nil {
		return nil, s.wrap("list in-flight commands", err)
	}
	out, err := collect(rows, scanCommand)
	return out, s.wrap("list in-flight commands", err)
}

// CommandCancelsPending returns a gateway's live commands to cancel.
func (s *Store) CommandCancelsPending(ctx context.Context, gatewayID string) ([]*store.Command, error) {
	rows, err := s.db.Query(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE gateway_id = $1 AND cancel_requested AND state IN `+inFlightStates+` ORDER BY id`, gatewayID)
	if err != nil {
		return nil, s.wrap("list cancels", err)
	}
	out, err := collect(rows, scanCommand)
	return out, s.wrap("list cancels", err)
}
