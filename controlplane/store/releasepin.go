package store

import (
	"context"
	"time"
)

// ReleasePinStatement is a signed pin statement the control plane accepted
// (installer/manifest.PinStatement; docs/releases.md, "Pin statements"):
// gateways send every one to every node offering the release.pins
// capability.
type ReleasePinStatement struct {
	// ID is "rps_" and a random suffix.
	ID string
	// Action is "add" or "remove"; Pin is the pin it adds or removes.
	Action, Pin string
	// Statement and Signature are the document and its minisign
	// signature, as signed.
	Statement, Signature []byte
	// SignedAt is the statement's created_at.
	SignedAt time.Time
	// AddedBy is the actor that uploaded it ("token:<id>").
	AddedBy string
	AddedAt time.Time
}

// ReleasePinCounts is how many live nodes (nodes with an open session)
// reported holding any of a set of pins.
type ReleasePinCounts struct {
	Live, Holding int
	// Missing lists live nodes that do not hold it, by id, at most the
	// limit asked for.
	Missing []string
}

// ReleasePinStore keeps pin statements and the pins nodes hold.
type ReleasePinStore interface {
	// ReleasePinStatementAdd stores a statement; ID defaults to a new
	// "rps_" id and AddedAt to now.
	ReleasePinStatementAdd(ctx context.Context, st *ReleasePinStatement) (*ReleasePinStatement, error)
	// ReleasePinStatements lists every statement, oldest first.
	ReleasePinStatements(ctx context.Context) ([]*ReleasePinStatement, error)
	// NodeReleasePinsSet replaces the pins a node reported holding; a node
	// deleted since is not an error.
	NodeReleasePinsSet(ctx context.Context, nodeID string, pins []string, now *time.Time) error
	// ReleasePinCounts counts the live nodes and those of them that hold
	// any of pins, listing at most missingLimit that hold none.
	ReleasePinCounts(ctx context.Context, pins []string, missingLimit int) (*ReleasePinCounts, error)
}
