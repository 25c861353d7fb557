package queries

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

const tunnelColumns = `id, node_id, kind, port, as_root, created_by, created_at, expires_at, opened_at, closed_at,
	gateway_id, bytes_in, bytes_out, exit_code, reason`

func scanTunnel(r Row) (*store.Tunnel, error) {
	t := &store.Tunnel{}
	return t, r.Scan(&t.ID, &t.NodeID, &t.Kind, &t.Port, &t.AsRoot, &t.CreatedBy, &t.CreatedAt, &t.ExpiresAt, &t.OpenedAt,
		&t.ClosedAt, &t.GatewayID, &t.BytesIn, &t.BytesOut, &t.ExitCode, &t.Reason)
}

// tunnelEvent is a tunnel's event.
func tunnelEvent(typ string, t *store.Tunnel, signal string) event {
	return event{typ, t.ID, events.TunnelData{TunnelID: t.ID, NodeID: t.NodeID, Kind: t.Kind, Port: t.Port, AsRoot: t.AsRoot,
		CreatedBy: t.CreatedBy, GatewayID: t.GatewayID, BytesIn: t.BytesIn, BytesOut: t.BytesOut, ExitCode: t.ExitCode,
		Signal: signal, Reason: t.Reason}}
}

// TunnelCreate stores a tunnel's ticket.
func (s *Store) TunnelCreate(ctx context.Context, p *store.TunnelCreateParams) (*store.Tunnel, error) {
	now := time.Now()
	if p.Now != nil {
		now = *p.Now
	}
	t, err := scanTunnel(s.db.QueryRow(ctx, `INSERT INTO tunnels
		(id, secret_hash, node_id, kind, port, as_root, created_by, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING `+tunnelColumns,
		p.ID, p.SecretHash, p.NodeID, p.Kind, p.Port, p.AsRoot, p.CreatedBy, now, now.Add(p.TTL)))
	if err != nil {
		return nil, s.wrap("create tunnel", err)
	}
	return t, nil
}

// TunnelUse consumes a ticket: one conditional UPDATE, so two uses at once
// open one tunnel.
func (s *Store) TunnelUse(ctx context.Context, p *store.TunnelUseParams) (*store.Tunnel, error) {
	now := s.clock(p.Now)
	t, err := scanTunnel(s.db.QueryRow(ctx, `UPDATE tunnels SET opened_at = coalesce($3, now())
		WHERE id = $1 AND secret_hash = $2 AND opened_at IS NULL AND expires_at > coalesce($3, now())
		RETURNING `+tunnelColumns, p.ID, p.SecretHash, now))
	if err == nil {
		return t, nil
	}
	if !errors.Is(s.d.Translate(err), store.ErrNotFound) {
		return nil, s.wrap("use tunnel ticket", err)
	}
	// Say why, from the row as it is now.
	var hash []byte
	var used, expired bool
	err = s.db.QueryRow(ctx, `SELECT secret_hash, opened_at IS NOT NULL, expires_at <= coalesce($2, now())
		FROM tunnels WHERE id = $1`, p.ID, now).Scan(&hash, &used, &expired)
	switch {
	case errors.Is(s.d.Translate(err), store.ErrNotFound):
		return nil, fmt.Errorf("use tunnel ticket: %w", store.ErrTunnelTicketInvalid)
	case err != nil:
		return nil, s.wrap("use tunnel ticket", err)
	case subtle.ConstantTimeCompare(hash, p.SecretHash) != 1:
		return nil, fmt.Errorf("use tunnel ticket: %w", store.ErrTunnelTicketInvalid)
	case used:
		return nil, fmt.Errorf("use tunnel ticket: %w", store.ErrTunnelTicketUsed)
	case expired:
		return nil, fmt.Errorf("use tunnel ticket: %w", store.ErrTunnelTicketExpired)
	}
	return nil, fmt.Errorf("use tunnel ticket: %w", store.ErrTunnelTicketInvalid)
}

// TunnelOpened records the gateway and writes tunnel.opened.
func (s *Store) TunnelOpened(ctx context.Context, id, gatewayID string, now *time.Time) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		t, err := scanTunnel(q.db.QueryRow(ctx, `UPDATE tunnels SET gateway_id = $2 WHERE id = $1 RETURNING `+tunnelColumns, id, gatewayID))
		if err != nil {
			return q.wrap("record tunnel "+id+" opened", err)
		}
		return q.emit(ctx, now, tunnelEvent(events.TunnelOpened, t, ""))
	})
}

// TunnelClose records the end and writes tunnel.closed, once.
func (s *Store) TunnelClose(ctx context.Context, p *store.TunnelCloseParams) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		t, err := scanTunnel(q.db.QueryRow(ctx, `UPDATE tunnels SET closed_at = coalesce($2, now()), bytes_in = $3, bytes_out = $4,
			exit_code = $5, reason = $6 WHERE id = $1 AND closed_at IS NULL RETURNING `+tunnelColumns,
			p.ID, q.clock(p.Now), p.BytesIn, p.BytesOut, p.ExitCode, p.Reason))
		if isNotFound(q.wrap("close tunnel", err)) {
			return nil // closed already, or unknown
		}
		if err != nil {
			return q.wrap("close tunnel "+p.ID, err)
		}
		return q.emit(ctx, p.Now, tunnelEvent(events.TunnelClosed, t, p.Signal))
	})
}

// TunnelGet returns a tunnel (never its secret).
func (s *Store) TunnelGet(ctx context.Context, id string) (*store.Tunnel, error) {
	t, err := scanTunnel(s.db.QueryRow(ctx, `SELECT `+tunnelColumns+` FROM tunnels WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get tunnel "+id, err)
	}
	return t, nil
}
