package store

import (
	"context"
	"time"
)

// AuditEntry records a call or an attempt: who did what, from where, and
// how it ended.
type AuditEntry struct {
	ID       int64
	Time     time.Time
	Actor    string
	Action   string
	Resource string
	Outcome  string
	SourceIP string
	Details  []byte // JSON
	// TenantID is the tenant of the caller the row records (RootTenant
	// for rows written before tenants, and for callers without a token).
	TenantID string
}

// AuditQueryParams filter AuditQuery. Every filter is optional (zero
// means any) and all apply together.
type AuditQueryParams struct {
	// BeforeID pages: only rows with a lower id (0 starts at the newest).
	BeforeID int64
	// Since and Until bound the row's time: Since <= time < Until.
	Since, Until time.Time
	// Actor, Resource and Outcome match exactly.
	Actor, Resource, Outcome string
	// ActionPrefix matches actions that start with it, byte for byte
	// ("joinTokens." matches joinTokens.create; no wildcards).
	ActionPrefix string
	// Within, when set, is a tenant's Path: only rows whose TenantID lies
	// within that tenant (docs/tenants.md).
	Within string
	// Limit is 1 to MaxListLimit; 0 means 100.
	Limit int
}

// AuditStore keeps the audit log.
type AuditStore interface {
	AuditInsert(ctx context.Context, e *AuditEntry) (int64, error)
	// AuditList returns entries after afterID, oldest first.
	AuditList(ctx context.Context, afterID int64, limit int) ([]*AuditEntry, error)
	// AuditQuery returns the entries p selects, newest first (by id).
	AuditQuery(ctx context.Context, p *AuditQueryParams) ([]*AuditEntry, error)
	AuditPrune(ctx context.Context, before time.Time) (int64, error)
}
