package store

import (
	"context"
	"time"
)

// PKIBundle is the sealed PKI bundle (DESIGN.md, "PKI").
type PKIBundle struct {
	TrustDomain string
	Sealed      []byte
	// Prev, when set on PKIBundleUpdate, is the sealed bundle the update
	// was computed from: the update applies only while the stored bundle
	// is still Prev, and is ErrConflict otherwise (another rotation's
	// phase change replaced it meanwhile). Never set on reads.
	Prev      []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Revocation revokes one certificate serial, optionally naming its node.
type Revocation struct {
	Serial    string
	NodeID    string
	Reason    string
	RevokedAt time.Time
}

// PKIStore keeps the sealed bundle and revocations.
type PKIStore interface {
	// PKIBundleGet returns the bundle; ErrNotFound before pki init.
	PKIBundleGet(ctx context.Context) (*PKIBundle, error)
	// PKIBundleCreate stores the first bundle; ErrConflict if one exists.
	PKIBundleCreate(ctx context.Context, b *PKIBundle) error
	// PKIBundleUpdate replaces the bundle (CA rotation); with b.Prev set,
	// only while the stored bundle is b.Prev (ErrConflict otherwise).
	PKIBundleUpdate(ctx context.Context, b *PKIBundle) error
	// RevocationInsert revokes a serial; revoking twice is not an error.
	RevocationInsert(ctx context.Context, r *Revocation) error
	// RevocationList returns revocations made at or after since, oldest
	// first: the revocation feed.
	RevocationList(ctx context.Context, since time.Time) ([]*Revocation, error)
	// RevocationCheck reports whether serial is revoked.
	RevocationCheck(ctx context.Context, serial string) (bool, error)
}
