package bootstrap_test

import (
	"context"
	"errors"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// errInjected is the failure tokenFailing injects.
var errInjected = errors.New("injected api token failure")

// tokenFailing is a store whose transactions fail to create API tokens:
// pki init cut off between the bundle and the first admin token.
type tokenFailing struct{ store.Store }

func (s tokenFailing) Tx(ctx context.Context, fn func(store.Store) error) error {
	return s.Store.Tx(ctx, func(tx store.Store) error { return fn(tokenFailingTx{tx}) })
}

type tokenFailingTx struct{ store.Store }

func (tokenFailingTx) APITokenCreate(context.Context, *store.APIToken, []byte) error {
	return errInjected
}

// initStores are a fresh store of each backend.
func initStores(t *testing.T) map[string]func(t *testing.T) store.Store {
	return map[string]func(t *testing.T) store.Store{
		"sqlite": func(t *testing.T) store.Store { return sqlitetest.Open(t) },
		"postgres": func(t *testing.T) store.Store {
			ctx := context.Background()
			st, err := postgres.Open(ctx, pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if _, err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
}

func audited(calls *int) func(ctx context.Context, tx bootstrap.InitTx) error {
	return func(ctx context.Context, tx bootstrap.InitTx) error {
		*calls++
		_, err := tx.AuditInsert(ctx, &store.AuditEntry{Actor: "test", Action: "pki.init", Resource: "pki", Outcome: "success", Details: []byte(`{"trustDomain":"compute.example.com"}`)})
		return err
	}
}

// TestInitDeploymentIsOneTransaction: a failure between the bundle and the
// first admin token leaves neither (nor the audit entry), and a re-run
// makes both, with a token that authenticates.
func TestInitDeploymentIsOneTransaction(t *testing.T) {
	t.Parallel()
	for name, open := range initStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := open(t)
			var calls int
			if _, err := bootstrap.InitDeployment(ctx, tokenFailing{st}, secret, "compute.example.com", 0, audited(&calls)); !errors.Is(err, errInjected) {
				t.Fatalf("init with a failing token: %v, want the injected failure", err)
			}
			if calls != 1 {
				t.Fatalf("record called %d times, want 1 (before the token)", calls)
			}
			if _, err := st.PKIBundleGet(ctx); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("bundle after the failed init: %v, want ErrNotFound (rolled back)", err)
			}
			if a, err := st.AuditList(ctx, 0, 10); err != nil || len(a) != 0 {
				t.Fatalf("audit after the failed init: %d entries, %v; want none", len(a), err)
			}

			made, err := bootstrap.InitDeployment(ctx, st, secret, "compute.example.com", 0, audited(&calls))
			if err != nil {
				t.Fatalf("re-run: %v", err)
			}
			if made.Completed || made.AdminToken == "" || made.Bundle.TrustDomain != "compute.example.com" {
				t.Fatalf("re-run made %+v, want a new bundle and an admin token", made)
			}
			tok, err := st.APITokenBySecret(ctx, iam.Hash(made.AdminToken))
			if err != nil || tok.Role != store.RoleAdmin {
				t.Fatalf("the admin token: %+v, %v; want an admin token", tok, err)
			}
			loaded, err := bootstrap.LoadBundle(ctx, st, secret)
			if err != nil || loaded.GatewayPin() != made.Bundle.GatewayPin() {
				t.Fatalf("stored bundle %v, %v; want the one made", loaded, err)
			}
			if _, err := bootstrap.InitDeployment(ctx, st, secret, "compute.example.com", 0, audited(&calls)); !errors.Is(err, store.ErrConflict) {
				t.Fatalf("third run: %v, want ErrConflict (pki init runs once)", err)
			}
		})
	}
}

// TestInitDeploymentCompletesAnEarlierInit: a bundle without any API token
// (what pki init left when it failed between them, before it was one
// transaction) is completed by a re-run for the same trust domain, and
// refused for another.
func TestInitDeploymentCompletesAnEarlierInit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	earlier, err := bootstrap.InitBundle(ctx, st, secret, "compute.example.com")
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	if _, err := bootstrap.InitDeployment(ctx, st, secret, "other.example.com", 0, audited(&calls)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("init for another trust domain: %v, want ErrConflict", err)
	}
	if _, err := bootstrap.InitDeployment(ctx, st, "wrong-secret-wrong-secret-wrong-secret", "compute.example.com", 0, audited(&calls)); err == nil {
		t.Fatal("completing with another secret succeeded")
	}
	made, err := bootstrap.InitDeployment(ctx, st, secret, "compute.example.com", 0, audited(&calls))
	if err != nil {
		t.Fatal(err)
	}
	if !made.Completed || made.AdminToken == "" || made.Bundle.GatewayPin() != earlier.GatewayPin() {
		t.Fatalf("completed %+v, want the earlier bundle and a new admin token", made)
	}
	if _, err := st.APITokenBySecret(ctx, iam.Hash(made.AdminToken)); err != nil {
		t.Fatalf("the admin token: %v", err)
	}
}
