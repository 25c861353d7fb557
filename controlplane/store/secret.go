package store

import (
	"context"
	"time"
)

// Secret is a value sealed under the deployment secret for a node or a
// site agent (BMC credentials); the store never sees it in plain text.
type Secret struct {
	Name      string
	NodeID    string
	Sealed    []byte
	CreatedAt time.Time
}

// SecretStore keeps sealed secrets.
type SecretStore interface {
	SecretPut(ctx context.Context, s *Secret) error
	SecretGet(ctx context.Context, name string) (*Secret, error)
	SecretDelete(ctx context.Context, name string) error
}
