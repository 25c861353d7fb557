package store

import (
	"context"
	"time"
)

// LeaseStore keeps named leases: the single-writer guarantee of every job.
// Names follow DESIGN.md: shard:<n>, singleton:<name>, gateway:<id>.
type LeaseStore interface {
	// LeaseAcquire takes the lease when it is free, expired or already held
	// by the same holder (then it is renewed at the same epoch). A takeover
	// raises the epoch by one. ok is false, with a nil error, when another
	// holder has it: that is a normal result.
	LeaseAcquire(ctx context.Context, p *LeaseAcquireParams) (lease *Lease, ok bool, err error)
	// LeaseRenew extends a lease the holder still holds at its epoch and that
	// has not expired. ok is false when it was lost.
	LeaseRenew(ctx context.Context, p *LeaseRenewParams) (lease *Lease, ok bool, err error)
	// LeaseRelease gives a lease up at once, so the next acquirer need not
	// wait for expiry. Releasing a lease not held is a no-op.
	LeaseRelease(ctx context.Context, name, holder string, epoch int64) error
	// LeaseGet returns a lease, expired or not; ErrNotFound if never taken.
	LeaseGet(ctx context.Context, name string) (*Lease, error)
	// LeaseList returns leases whose name starts with prefix, by name.
	LeaseList(ctx context.Context, prefix string) ([]*Lease, error)
}

// Lease is a named, expiring claim of single-writer ownership.
type Lease struct {
	Name       string
	Holder     string
	Epoch      int64
	AcquiredAt time.Time
	RenewedAt  time.Time
	ExpiresAt  time.Time
}

// Fence names the lease a write is made under.
type Fence struct {
	Lease  string
	Holder string
	Epoch  int64
	// Now overrides the database clock for the expiry check (tests only).
	Now *time.Time
}

// LeaseAcquireParams are LeaseAcquire's inputs.
type LeaseAcquireParams struct {
	Name   string
	Holder string
	TTL    time.Duration
	Now    *time.Time
}

// LeaseRenewParams are LeaseRenew's inputs.
type LeaseRenewParams struct {
	Name   string
	Holder string
	Epoch  int64
	TTL    time.Duration
	Now    *time.Time
}
