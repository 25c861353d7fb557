package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Transactor runs fn in one store transaction (store.Transactor).
type Transactor = store.Transactor

// InitTx is what pki init's transaction touches: the bundle, the first
// admin token and the audit row that record writes.
type InitTx interface {
	Store
	iam.TokenCreator
	APITokenList(ctx context.Context, p *store.ListParams) ([]*store.APIToken, error)
	AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
}

// Initialised is what InitDeployment made.
type Initialised struct {
	// Bundle is the deployment's PKI bundle.
	Bundle *pki.Bundle
	// AdminToken is the secret of the deployment's first admin token (shown
	// once), made when the database held no API token; empty otherwise.
	AdminToken string
	// Completed reports a re-run that found the bundle of an earlier pki
	// init without any API token and made only the token.
	Completed bool
}

// InitDeployment is pki init: in one transaction it makes a PKI bundle for
// trustDomain, its node CA valid for nodeCAValidity (zero:
// pki.DefaultCAValidity), sealed under secret, stores it, calls record with the
// transaction's store (the audit entry), and, when the database holds no
// API token, makes the deployment's first admin token. A failure anywhere
// leaves neither bundle nor token, so pki init can run again.
//
// A database that already holds a bundle fails wrapping store.ErrConflict,
// except when that bundle is for trustDomain, opens with secret, and the
// database holds no API token: an earlier pki init stopped between the two
// (builds before this transaction wrote them apart), and this run
// completes it, making the admin token only (Completed).
func InitDeployment(ctx context.Context, st Transactor, secret, trustDomain string, nodeCAValidity time.Duration, record func(ctx context.Context, tx InitTx) error) (*Initialised, error) {
	var out *Initialised
	err := store.InTx(ctx, st, func(tx InitTx) error {
		out = &Initialised{}
		existing, err := tx.PKIBundleGet(ctx)
		switch {
		case err == nil:
			toks, err := tx.APITokenList(ctx, &store.ListParams{Limit: 1})
			if err != nil {
				return fmt.Errorf("list api tokens: %w", err)
			}
			if existing.TrustDomain != trustDomain || len(toks) > 0 {
				return fmt.Errorf("the database already holds a PKI bundle for trust domain %s (made %s): pki init runs once per deployment (%w)",
					existing.TrustDomain, existing.CreatedAt.UTC().Format(time.RFC3339), store.ErrConflict)
			}
			b, err := openBundle(secret, existing)
			if err != nil {
				return fmt.Errorf("complete the earlier pki init: %w", err)
			}
			out.Bundle, out.Completed = b, true
		case errors.Is(err, store.ErrNotFound):
			b, err := InitBundleWith(ctx, tx, secret, pki.InitOptions{TrustDomain: trustDomain, NodeValidity: nodeCAValidity})
			if err != nil {
				return err
			}
			out.Bundle = b
		default:
			return fmt.Errorf("load pki bundle: %w", err)
		}
		if err := record(ctx, tx); err != nil {
			return err
		}
		toks, err := tx.APITokenList(ctx, &store.ListParams{Limit: 1})
		if err != nil {
			return fmt.Errorf("list api tokens: %w", err)
		}
		if len(toks) == 0 {
			out.AdminToken, _, err = iam.Create(ctx, tx, iam.CreateParams{Role: store.RoleAdmin, Description: "first admin token (pki init)"})
			if err != nil {
				return fmt.Errorf("first admin token: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
