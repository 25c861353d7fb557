package store

import (
	"context"
	"time"
)

// PolicyDocument is one tenant's policy document as applied (migration
// 0032, docs/policies.md): the YAML text `policy apply` replaced the
// tenant's policies with.
type PolicyDocument struct {
	TenantID string
	Document string
	// Names are the document's policy names, in order.
	Names []string
	// Version counts the tenant's applies: 1 for the first.
	Version   int64
	UpdatedBy string
	UpdatedAt time.Time
}

// AnyPolicyVersion is PolicyDocumentPut's expectedVersion that accepts
// whatever version the tenant's document is at.
const AnyPolicyVersion = -1

// PolicyStore keeps the tenants' policy documents.
type PolicyStore interface {
	// PolicyDocumentGet returns a tenant's document: ErrNotFound when none
	// was applied.
	PolicyDocumentGet(ctx context.Context, tenantID string) (*PolicyDocument, error)
	// PolicyDocumentPut replaces the tenant's document with d (Version and
	// UpdatedAt are set: the next version, now) and returns it. With
	// expectedVersion other than AnyPolicyVersion it is ErrConflict unless
	// the stored version is that (0: none yet).
	PolicyDocumentPut(ctx context.Context, d *PolicyDocument, expectedVersion int64) (*PolicyDocument, error)
	// PolicyDocumentList pages the documents of live tenants within
	// p.Within by tenant id.
	PolicyDocumentList(ctx context.Context, p *ListParams) ([]*PolicyDocument, error)
	// PolicyStamp changes whenever any tenant's document does (the sum of
	// every document's version): a process re-reads the documents when it
	// differs from the one it compiled.
	PolicyStamp(ctx context.Context) (int64, error)
}
