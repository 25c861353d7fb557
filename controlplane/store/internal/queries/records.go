package queries

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
)

// OutboxInsert appends an entry to the outbox. It holds the dialect's
// OutboxWriteLock until its transaction ends (so a reader waits for that
// commit): the insert belongs at the end of its transaction.
func (s *Store) OutboxInsert(ctx context.Context, topic, key string, payload []byte) (int64, error) {
	var id int64
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if err := q.outboxWrite(ctx); err != nil {
			return err
		}
		err := q.db.QueryRow(ctx, `INSERT INTO outbox (topic, key, payload, created_at) VALUES ($1, $2, $3, now())
			RETURNING id`, topic, key, JSON(payload)).Scan(&id)
		return q.wrap("insert outbox entry", err)
	})
	return id, err
}

// OutboxList returns entries after afterID, oldest first: under the
// dialect's OutboxReadLock, only once every entry with a lower id has
// committed or rolled back.
func (s *Store) OutboxList(ctx context.Context, afterID int64, n int) ([]*store.OutboxEntry, error) {
	var out []*store.OutboxEntry
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if q.d.OutboxReadLock != "" {
			if _, err := q.db.Exec(ctx, q.d.OutboxReadLock); err != nil {
				return q.wrap("lock outbox", err)
			}
		}
		rows, err := q.db.Query(ctx, `SELECT id, topic, key, payload, created_at FROM outbox
			WHERE id > $1 ORDER BY id LIMIT $2`, afterID, limit(n))
		if err != nil {
			return q.wrap("list outbox", err)
		}
		out, err = collect(rows, func(r Row) (*store.OutboxEntry, error) {
			e := &store.OutboxEntry{}
			return e, r.Scan(&e.ID, &e.Topic, &e.Key, &e.Payload, &e.CreatedAt)
		})
		return q.wrap("list outbox", err)
	})
	return out, err
}

// OutboxCursor returns a sink's delivery cursor.
func (s *Store) OutboxCursor(ctx context.Context, sink string) (int64, error) {
	var id int64
	err := s.db.QueryRow(ctx, `SELECT last_id FROM outbox_cursors WHERE sink = $1`, sink).Scan(&id)
	if err != nil && isNotFound(s.d.Translate(err)) {
		return 0, nil
	}
	return id, s.wrap("read outbox cursor of "+sink, err)
}

// OutboxCursorSet moves a sink's delivery cursor.
func (s *Store) OutboxCursorSet(ctx context.Context, sink string, lastID int64) error {
	_, err := s.db.Exec(ctx, `INSERT INTO outbox_cursors (sink, last_id, updated_at) VALUES ($1, $2, now())
		ON CONFLICT (sink) DO UPDATE SET last_id = excluded.last_id, updated_at = excluded.updated_at`, sink, lastID)
	return s.wrap("set outbox cursor of "+sink, err)
}

// OutboxMaxID returns the newest entry's id, 0 for an empty outbox.
func (s *Store) OutboxMaxID(ctx context.Context) (int64, error) {
	var id int64
	err := s.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&id)
	return id, s.wrap("read newest outbox id", err)
}

func nullJSON(b []byte) any {
	if b == nil {
		return nil
	}
	return JSON(b)
}

// EventInsert records an event.
func (s *Store) EventInsert(ctx context.Context, e *store.Event) (int64, error) {
	t := e.Time
	if t.IsZero() {
		t = time.Now()
	}
	payload := e.Payload
	if f := e.GPUFinding; f != nil {
		var err error
		if payload, err = gpufinding.Marshal(f); err != nil {
			return 0, fmt.Errorf("insert event: %w", err)
		}
	}
	var id int64
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		err := q.db.QueryRow(ctx, `INSERT INTO events (node_id, kind, severity, message, time, payload)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
			e.NodeID, e.Kind, e.Severity, e.Message, t.UTC(), nullJSON(payload)).Scan(&id)
		if err != nil {
			return q.wrap("insert event", err)
		}
		if e.GPUFinding == nil {
			return nil
		}
		// A finding with a resolution is the remediation reconciler's
		// input, recorded in the event's transaction.
		if err := q.remediationFinding(ctx, id, e, t); err != nil {
			return err
		}
		return q.emit(ctx, &t, gpuEvent(e, payload))
	})
	return id, err
}

// gpuEvent is the gpu.health-changed event of a node's GPU event: the
// finding's GPU, XID and resolution, and the finding itself as stored
// (finding, protojson).
func gpuEvent(e *store.Event, finding []byte) event {
	f := e.GPUFinding
	subject := f.GetGpuUuid()
	if subject == "" {
		subject = e.NodeID
	}
	return event{events.GPUHealthChanged, subject, events.GPUHealthData{NodeID: e.NodeID, GPUUUID: f.GetGpuUuid(),
		Kind: e.Kind, Severity: e.Severity, Message: e.Message, XID: int(f.GetXid().GetCode()),
		XIDMnemonic: f.GetXid().GetMnemonic(), Resolution: f.GetResolution(), Finding: finding}}
}

// EventList returns events after AfterID, oldest first.
func (s *Store) EventList(ctx context.Context, p *store.EventListParams) ([]*store.Event, error) {
	rows, err := s.db.Query(ctx, `SELECT id, node_id, kind, severity, message, time, payload FROM events
		WHERE id > $1 AND ($2 = '' OR node_id = $2) ORDER BY id LIMIT $3`, p.AfterID, p.NodeID, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list events", err)
	}
	out, err := collect(rows, func(r Row) (*store.Event, error) {
		e := &store.Event{}
		return e, r.Scan(&e.ID, &e.NodeID, &e.Kind, &e.Severity, &e.Message, &e.Time, &e.Payload)
	})
	return out, s.wrap("list events", err)
}

// EventPrune deletes events older than before.
func (s *Store) EventPrune(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM events WHERE time < $1`, before)
	if err != nil {
		return n, s.wrap("prune events", err)
	}
	// The session starts the rollouts' health gates count go with them.
	_, err = s.db.Exec(ctx, `DELETE FROM session_starts WHERE at < $1`, before)
	return n, s.wrap("prune session starts", err)
}

// auditColumns are an audit row's columns, in the order AuditList scans.
const auditColumns = `id, time, actor, action, resource, outcome, source_ip, details, tenant_id`

// AuditInsert appends to the audit log.
func (s *Store) AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error) {
	t := e.Time
	if t.IsZero() {
		t = time.Now()
	}
	var id int64
	err := s.db.QueryRow(ctx, `INSERT INTO audit_log (time, actor, action, resource, outcome, source_ip, details, tenant_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`,
		t.UTC(), e.Actor, e.Action, e.Resource, e.Outcome, e.SourceIP, nullJSON(e.Details), cmp.Or(e.TenantID, store.RootTenant)).Scan(&id)
	return id, s.wrap("insert audit entry", err)
}

// AuditList returns audit entries after afterID, oldest first.
func (s *Store) AuditList(ctx context.Context, afterID int64, n int) ([]*store.AuditEntry, error) {
	rows, err := s.db.Query(ctx, `SELECT `+auditColumns+` FROM audit_log
		WHERE id > $1 ORDER BY id LIMIT $2`, afterID, limit(n))
	if err != nil {
		return nil, s.wrap("list audit log", err)
	}
	out, err := collect(rows, func(r Row) (*store.AuditEntry, error) {
		e := &store.AuditEntry{}
		return e, r.Scan(&e.ID, &e.Time, &e.Actor, &e.Action, &e.Resource, &e.Outcome, &e.SourceIP, &e.Details, &e.TenantID)
	})
	return out, s.wrap("list audit log", err)
}

// AuditQuery returns the entries p selects, newest first. Only the filters
// that are set become conditions, so the time bounds use audit_log_time_idx
// and the order the primary key. The action prefix is compared with substr,
// not LIKE: the same bytes on both dialects, with no wildcard to escape.
func (s *Store) AuditQuery(ctx context.Context, p *store.AuditQueryParams) ([]*store.AuditEntry, error) {
	var where []string
	var args []any
	cond := func(sql string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(sql, len(args)))
	}
	if p.BeforeID > 0 {
		cond("id < $%d", p.BeforeID)
	}
	if !p.Since.IsZero() {
		cond("time >= $%d", p.Since.UTC())
	}
	if !p.Until.IsZero() {
		cond("time < $%d", p.Until.UTC())
	}
	if p.Actor != "" {
		cond("actor = $%d", p.Actor)
	}
	if p.Resource != "" {
		cond("resource = $%d", p.Resource)
	}
	if p.Outcome != "" {
		cond("outcome = $%d", p.Outcome)
	}
	if p.ActionPrefix != "" {
		args = append(args, p.ActionPrefix)
		n := len(args)
		where = append(where, fmt.Sprintf("substr(action, 1, length(CAST($%d AS TEXT))) = CAST($%d AS TEXT)", n, n))
	}
	if p.Within != "" {
		args = append(args, p.Within)
		where = append(where, withinTenant("tenant_id", len(args)))
	}
	q := `SELECT ` + auditColumns + ` FROM audit_log`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, limit(p.Limit))
	q += fmt.Sprintf(" ORDER BY id DESC LIMIT $%d", len(args))
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, s.wrap("query audit log", err)
	}
	out, err := collect(rows, func(r Row) (*store.AuditEntry, error) {
		e := &store.AuditEntry{}
		return e, r.Scan(&e.ID, &e.Time, &e.Actor, &e.Action, &e.Resource, &e.Outcome, &e.SourceIP, &e.Details, &e.TenantID)
	})
	return out, s.wrap("query audit log", err)
}

// AuditPrune deletes audit entries older than before.
func (s *Store) AuditPrune(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM audit_log WHERE time < $1`, before)
	return n, s.wrap("prune audit log", err)
}

// PKIBundleGet returns the sealed bundle.
func (s *Store) PKIBundleGet(ctx context.Context) (*store.PKIBundle, error) {
	b := &store.PKIBundle{}
	err := s.db.QueryRow(ctx, `SELECT trust_domain, sealed, created_at, updated_at FROM pki_bundle WHERE id = 1`).
		Scan(&b.TrustDomain, &b.Sealed, &b.CreatedAt, &b.UpdatedAt)
	if err != nil {
		return nil, s.wrap("get pki bundle", err)
	}
	return b, nil
}

// PKIBundleCreate stores the first bundle.
func (s *Store) PKIBundleCreate(ctx context.Context, b *store.PKIBundle) error {
	_, err := s.db.Exec(ctx, `INSERT INTO pki_bundle (id, trust_domain, sealed, created_at, updated_at)
		VALUES (1, $1, $2, now(), now())`, b.TrustDomain, b.Sealed)
	return s.wrap("create pki bundle", err)
}

// PKIBundleUpdate replaces the bundle.
func (s *Store) PKIBundleUpdate(ctx context.Context, b *store.PKIBundle) error {
	if b.Prev == nil {
		return s.exec1(ctx, "update pki bundle", `UPDATE pki_bundle SET trust_domain = $1, sealed = $2, updated_at = now()
		WHERE id = 1`, b.TrustDomain, b.Sealed)
	}
	// On PostgreSQL (read committed) an UPDATE that waited for another
	// transaction's re-reads the row it changed: sealed then differs, and
	// nothing is written.
	err := s.exec1(ctx, "update pki bundle", `UPDATE pki_bundle SET trust_domain = $1, sealed = $2, updated_at = now()
		WHERE id = 1 AND sealed = $3`, b.TrustDomain, b.Sealed, b.Prev)
	if errors.Is(err, store.ErrNotFound) {
		var one int
		if e := s.db.QueryRow(ctx, `SELECT 1 FROM pki_bundle WHERE id = 1`).Scan(&one); e == nil {
			return fmt.Errorf("update pki bundle: %w: it changed since it was read", store.ErrConflict)
		}
	}
	return err
}

// RevocationInsert revokes a serial.
// A first revocation of a node's serial writes node.revoked in the same
// transaction.
func (s *Store) RevocationInsert(ctx context.Context, r *store.Revocation) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.db.Exec(ctx, `INSERT INTO revocations (serial, node_id, reason, revoked_at) VALUES ($1, $2, $3, now())
			ON CONFLICT (serial) DO NOTHING`, r.Serial, r.NodeID, r.Reason)
		if err != nil || n == 0 || r.NodeID == "" {
			return q.wrap("revoke "+r.Serial, err)
		}
		return q.emit(ctx, nil, event{events.NodeRevoked, r.NodeID,
			events.NodeRevokedData{NodeID: r.NodeID, Serial: r.Serial, Reason: r.Reason}})
	})
}

// RevocationList returns revocations since a time, oldest first.
func (s *Store) RevocationList(ctx context.Context, since time.Time) ([]*store.Revocation, error) {
	rows, err := s.db.Query(ctx, `SELECT serial, node_id, reason, revoked_at FROM revocations
		WHERE revoked_at >= $1 ORDER BY revoked_at, serial`, since.UTC())
	if err != nil {
		return nil, s.wrap("list revocations", err)
	}
	out, err := collect(rows, func(r Row) (*store.Revocation, error) {
		v := &store.Revocation{}
		return v, r.Scan(&v.Serial, &v.NodeID, &v.Reason, &v.RevokedAt)
	})
	return out, s.wrap("list revocations", err)
}

// RevocationCheck reports whether a serial is revoked.
func (s *Store) RevocationCheck(ctx context.Context, serial string) (bool, error) {
	var revoked bool
	err := s.db.QueryRow(ctx, `SELECT count(*) > 0 FROM revocations WHERE serial = $1`, serial).Scan(&revoked)
	return revoked, s.wrap("check revocation of "+serial, err)
}

const apiTokenColumns = `id, role, tenant_id, description, allow_cidrs, expires_at, revoked_at, created_at, session_id, subject, display_name, groups`

func scanAPIToken(r Row) (*store.APIToken, error) {
	t := &store.APIToken{}
	var cidrs []byte
	var groups string
	if err := r.Scan(&t.ID, &t.Role, &t.TenantID, &t.Description, &cidrs, &t.ExpiresAt, &t.RevokedAt, &t.CreatedAt,
		&t.SessionID, &t.Subject, &t.DisplayName, &groups); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(cidrs, &t.AllowCIDRs); err != nil {
		return nil, fmt.Errorf("decode allowed CIDRs of token %s: %w", t.ID, err)
	}
	t.Groups = splitLines(groups)
	return t, nil
}

// splitLines is the list a newline-joined column holds (nil for "").
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// APITokenCreate stores a token's hash and role.
func (s *Store) APITokenCreate(ctx context.Context, t *store.APIToken, secretHash []byte) error {
	cidrs := t.AllowCIDRs
	if cidrs == nil {
		cidrs = []string{}
	}
	b, err := json.Marshal(cidrs)
	if err != nil {
		return fmt.Errorf("create api token: %w", err)
	}
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		// A root token leaves tenant_id to its default ('root'), so this
		// build can still make one on a schema before tenants (a rolling
		// upgrade: migration 0024 not yet applied).
		var err error
		if tenant := cmp.Or(t.TenantID, store.RootTenant); tenant == store.RootTenant {
			_, err = q.db.Exec(ctx, `INSERT INTO api_tokens (id, secret_hash, role, description, allow_cidrs, expires_at, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, now())`, t.ID, secretHash, t.Role, t.Description, JSON(b), t.ExpiresAt)
		} else {
			_, err = q.db.Exec(ctx, `INSERT INTO api_tokens (id, secret_hash, role, tenant_id, description, allow_cidrs, expires_at, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, now())`, t.ID, secretHash, t.Role, tenant, t.Description, JSON(b), t.ExpiresAt)
		}
		if err != nil {
			return q.wrap("create api token", err)
		}
		return q.emit(ctx, nil, tokenEvent(events.TokenCreated, t))
	})
}

// tokenEvent is an API token's event.
func tokenEvent(typ string, t *store.APIToken) event {
	d := events.TokenData{TokenID: t.ID, Role: t.Role, Description: t.Description}
	if t.ExpiresAt != nil {
		e := t.ExpiresAt.UTC()
		d.ExpiresAt = &e
	}
	return event{typ, t.ID, d}
}

// APITokenBySecret returns the token with this secret hash.
func (s *Store) APITokenBySecret(ctx context.Context, secretHash []byte) (*store.APIToken, error) {
	t, err := scanAPIToken(s.db.QueryRow(ctx, `SELECT `+apiTokenColumns+` FROM api_tokens WHERE secret_hash = $1`, secretHash))
	if err != nil {
		return nil, s.wrap("get api token", err)
	}
	return t, nil
}

// APITokenGet returns a token by id.
func (s *Store) APITokenGet(ctx context.Context, id string) (*store.APIToken, error) {
	t, err := scanAPIToken(s.db.QueryRow(ctx, `SELECT `+apiTokenColumns+` FROM api_tokens WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get api token "+id, err)
	}
	return t, nil
}

// APITokenList pages tokens by id.
func (s *Store) APITokenList(ctx context.Context, p *store.ListParams) ([]*store.APIToken, error) {
	rows, err := s.db.Query(ctx, `SELECT `+apiTokenColumns+` FROM api_tokens WHERE id > $1 AND `+withinTenant("tenant_id", 3)+` ORDER BY id LIMIT $2`,
		p.Cursor, limit(p.Limit), p.Within)
	if err != nil {
		return nil, s.wrap("list api tokens", err)
	}
	out, err := collect(rows, scanAPIToken)
	return out, s.wrap("list api tokens", err)
}

// APITokenRevoke revokes a token.
// A first revocation writes token.revoked in the same transaction.
func (s *Store) APITokenRevoke(ctx context.Context, id string) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		t, err := scanAPIToken(q.db.QueryRow(ctx, `SELECT `+apiTokenColumns+` FROM api_tokens WHERE id = $1`+q.d.ForUpdate, id))
		if err != nil {
			return q.wrap("revoke api token "+id, err)
		}
		if err := q.exec1(ctx, "revoke api token "+id,
			`UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1`, id); err != nil || t.RevokedAt != nil {
			return err
		}
		return q.emit(ctx, nil, tokenEvent(events.TokenRevoked, t))
	})
}

// SecretPut stores or replaces a sealed secret.
func (s *Store) SecretPut(ctx context.Context, x *store.Secret) error {
	_, err := s.db.Exec(ctx, `INSERT INTO secrets (name, node_id, sealed, created_at) VALUES ($1, $2, $3, now())
		ON CONFLICT (name) DO UPDATE SET node_id = excluded.node_id, sealed = excluded.sealed`, x.Name, x.NodeID, x.Sealed)
	return s.wrap("put secret "+x.Name, err)
}

// SecretGet returns a sealed secret.
func (s *Store) SecretGet(ctx context.Context, name string) (*store.Secret, error) {
	x := &store.Secret{}
	err := s.db.QueryRow(ctx, `SELECT name, node_id, sealed, created_at FROM secrets WHERE name = $1`, name).
		Scan(&x.Name, &x.NodeID, &x.Sealed, &x.CreatedAt)
	if err != nil {
		return nil, s.wrap("get secret "+name, err)
	}
	return x, nil
}

// SecretDelete removes a secret.
func (s *Store) SecretDelete(ctx context.Context, name string) error {
	return s.exec1(ctx, "delete secret "+name, `DELETE FROM secrets WHERE name = $1`, name)
}

// TokensPrune deletes tokens expired or revoked before before.
func (s *Store) TokensPrune(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		for _, sql := range []string{
			`DELETE FROM join_tokens WHERE expires_at < $1 OR revoked_at < $1`,
			`DELETE FROM api_tokens WHERE expires_at < $1 OR revoked_at < $1`,
		} {
			n, err := q.db.Exec(ctx, sql, before)
			if err != nil {
				return q.wrap("prune tokens", err)
			}
			total += n
		}
		return nil
	})
	return total, err
}

// APITokenExpiry summarises the live API tokens' expiry in one query.
func (s *Store) APITokenExpiry(ctx context.Context, p *store.APITokenExpiryParams) (*store.APITokenExpiry, error) {
	out := &store.APITokenExpiry{}
	err := s.db.QueryRow(ctx, `SELECT min(expires_at),
		coalesce(sum(CASE WHEN expires_at <= coalesce($1, now()) + bc_micros($2) THEN 1 ELSE 0 END), 0)
		FROM api_tokens WHERE revoked_at IS NULL AND expires_at IS NOT NULL AND expires_at > coalesce($1, now())`,
		s.clock(p.Now), p.Within.Microseconds()).Scan(&out.Earliest, &out.Within)
	if err != nil {
		return nil, s.wrap("api token expiry", err)
	}
	return out, nil
}

// APITokensWarnExpiring marks and reports the live tokens that expire
// within p.Within, once each.
func (s *Store) APITokensWarnExpiring(ctx context.Context, p *store.APITokenExpiryParams) ([]string, error) {
	var ids []string
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		now := q.clock(p.Now)
		rows, err := q.db.Query(ctx, `UPDATE api_tokens SET expiry_warned = true
			WHERE NOT expiry_warned AND revoked_at IS NULL AND expires_at IS NOT NULL
				AND expires_at > coalesce($1, now())
				AND expires_at <= coalesce($1, now()) + bc_micros($2)
			RETURNING `+apiTokenColumns, now, p.Within.Microseconds())
		if err != nil {
			return q.wrap("warn of expiring api tokens", err)
		}
		toks, err := collect(rows, scanAPIToken)
		if err != nil {
			return q.wrap("warn of expiring api tokens", err)
		}
		evs := make([]event, 0, len(toks))
		for _, t := range toks {
			ids = append(ids, t.ID)
			evs = append(evs, tokenEvent(events.TokenExpiring, t))
		}
		return q.emit(ctx, now, evs...)
	})
	return ids, err
}
