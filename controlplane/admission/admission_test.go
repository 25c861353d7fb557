package admission_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/admission"
	"github.com/better-compute/better-compute/controlplane/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/jointoken"
)

type fixture struct {
	st     store.Store
	bundle *pki.Bundle
	pool   *store.Pool
	adm    *admission.Admitter
}

func setup(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	b, err := pki.Init(pki.InitOptions{TrustDomain: "compute.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	site, _ := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admission.New(admission.Config{NodeCertTTL: time.Hour}, st, b, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, bundle: b, pool: pool, adm: adm}
}

func (f *fixture) token(t *testing.T, ttl time.Duration) jointoken.Token {
	t.Helper()
	tok, _ := jointoken.New(f.bundle.GatewayPin(), nil)
	_, err := f.st.JoinTokenCreate(context.Background(), &store.JoinTokenCreateParams{
		ID: tok.ID(), SecretHash: tok.SecretHash(), PoolID: f.pool.ID, MaxUses: 10, ExpiresAt: time.Now().Add(ttl)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func csr(t *testing.T) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestJoinAndRejoin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	tok := f.token(t, time.Hour)
	req := &admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "gpu-01", MachineID: "m1"}, Source: "192.0.2.1"}
	first, err := f.adm.Join(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.Rejoined || first.Node.CertSerial != first.Cert.Serial || first.Cert.NotAfter.Sub(first.Cert.NotBefore) != time.Hour+pki.NodeBackdate {
		t.Fatalf("first join = %+v %+v", first, first.Cert)
	}
	req.CSR = csr(t)
	second, err := f.adm.Join(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !second.Rejoined || second.Node.ID != first.Node.ID || second.RevokedSerial != first.Cert.Serial {
		t.Fatalf("re-join = %+v", second)
	}
	renewed, err := f.adm.Renew(ctx, &admission.RenewRequest{NodeID: first.Node.ID, CSR: csr(t), Serial: second.Cert.Serial})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := f.st.NodeGet(ctx, first.Node.ID); n.CertSerial != renewed.Serial || n.Hostname != "gpu-01" {
		t.Fatalf("node after renew = %+v", n)
	}
	if _, err := f.adm.Renew(ctx, &admission.RenewRequest{NodeID: "node-gone", CSR: csr(t)}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("renew of an unknown node: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	tok := f.token(t, time.Hour)
	labels := map[string]string{}
	for i := range admission.MaxLabels + 1 {
		labels[strings.Repeat("k", i+1)] = "v"
	}
	for _, tc := range []struct {
		name  string
		req   admission.Request
		token bool
	}{
		{"no hostname", admission.Request{Token: tok.String(), CSR: csr(t)}, false},
		{"control character", admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "a\nb"}}, false},
		{"long hostname", admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: strings.Repeat("a", 254)}}, false},
		{"too many labels", admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "h", Labels: labels}}, false},
		{"big CSR", admission.Request{Token: tok.String(), CSR: make([]byte, admission.MaxCSRSize+1), Facts: admission.Facts{Hostname: "h"}}, false},
		{"expired", admission.Request{Token: f.token(t, -time.Second).String(), CSR: csr(t), Facts: admission.Facts{Hostname: "h"}}, true},
		{"malformed", admission.Request{Token: "nope", CSR: csr(t), Facts: admission.Facts{Hostname: "h"}}, true},
	} {
		_, err := f.adm.Join(ctx, &tc.req)
		if !errors.Is(err, admission.ErrRefused) || admission.IsTokenRefusal(err) != tc.token ||
			errors.Is(err, admission.ErrInvalidRequest) == tc.token {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	entries, _ := f.st.AuditList(ctx, 0, 100)
	if len(entries) != 7 {
		t.Fatalf("%d audit rows for 7 refusals", len(entries))
	}
	if tk, _ := f.st.JoinTokenGet(ctx, tok.ID()); tk.Uses != 0 {
		t.Fatalf("refusals used the token %d times", tk.Uses)
	}
}
