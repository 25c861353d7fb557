package admission_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
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
	return csrFor(t, key)
}

func csrFor(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// proven is what the gateway hands admission once it checked a KeyProof of
// the key certified by issued.
func proven(t *testing.T, nodeID string, issued *pki.Issued) *admission.ProvenKey {
	t.Helper()
	return &admission.ProvenKey{NodeID: nodeID, KeySHA256: issued.KeySHA256, Serial: issued.Serial, NotAfter: issued.NotAfter}
}

func revoked(t *testing.T, st store.Store, serial string) bool {
	t.Helper()
	r, err := st.RevocationCheck(context.Background(), serial)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestJoinSameHostnameIsANewNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	tok := f.token(t, time.Hour)
	req := &admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "gpu-01", MachineID: "m1"}, Source: "192.0.2.1"}
	first, err := f.adm.Join(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.Rejoined || first.Node.CertSerial != first.Cert.Serial || first.Cert.NotAfter.Sub(first.Cert.NotBefore) != time.Hour+pki.NodeBackdate ||
		first.Node.KeySHA256 != first.Cert.KeySHA256 || first.Node.JoinTokenID != tok.ID() || len(first.Warnings) != 0 {
		t.Fatalf("first join = %+v %+v", first, first.Cert)
	}
	// Another machine, same hostname and machine id (a cloned image): a
	// new node, a warning, and the first node's certificate stays good.
	req.CSR = csr(t)
	second, err := f.adm.Join(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if second.Rejoined || second.Node.ID == first.Node.ID || second.RevokedSerial != "" ||
		len(second.Warnings) != 1 || !strings.Contains(second.Warnings[0], first.Node.ID) {
		t.Fatalf("same hostname = %+v", second)
	}
	if revoked(t, f.st, first.Cert.Serial) {
		t.Fatal("a machine with the same hostname revoked the live node's certificate")
	}
	renewed, err := f.adm.Renew(ctx, &admission.RenewRequest{NodeID: first.Node.ID, CSR: csr(t), Serial: first.Cert.Serial})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := f.st.NodeGet(ctx, first.Node.ID); n.CertSerial != renewed.Serial || n.Hostname != "gpu-01" || n.KeySHA256 != renewed.KeySHA256 {
		t.Fatalf("node after renew = %+v", n)
	}
	if _, err := f.adm.Renew(ctx, &admission.RenewRequest{NodeID: "node-gone", CSR: csr(t)}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("renew of an unknown node: %v", err)
	}
}

func TestJoinRepeatedWithTheSameKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	tok, _ := jointoken.New(f.bundle.GatewayPin(), nil)
	if _, err := f.st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{
		ID: tok.ID(), SecretHash: tok.SecretHash(), PoolID: f.pool.ID, MaxUses: 1, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	req := &admission.Request{Token: tok.String(), CSR: csrFor(t, key), Facts: admission.Facts{Hostname: "gpu-02"}}
	first, err := f.adm.Join(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// The reply was lost; bcd retries with the same key and a new CSR.
	req.CSR = csrFor(t, key)
	again, err := f.adm.Join(ctx, req)
	if err != nil {
		t.Fatalf("repeated join: %v", err)
	}
	if !again.Repeated || again.Node.ID != first.Node.ID || again.Cert.Serial == first.Cert.Serial || again.Node.CertSerial != again.Cert.Serial {
		t.Fatalf("repeated join = %+v", again)
	}
	if tk, _ := f.st.JoinTokenGet(ctx, tok.ID()); tk.Uses != 1 {
		t.Fatalf("token uses = %d after a repeated join, want 1", tk.Uses)
	}
	// Another key with the used-up token is refused as before.
	req.CSR = csr(t)
	if _, err := f.adm.Join(ctx, req); !errors.Is(err, store.ErrTokenExhausted) {
		t.Fatalf("another key: %v, want ErrTokenExhausted", err)
	}
	// The same key after the token's revocation is refused too.
	if err := f.st.JoinTokenRevoke(ctx, tok.ID()); err != nil {
		t.Fatal(err)
	}
	req.CSR = csrFor(t, key)
	if _, err := f.adm.Join(ctx, req); !errors.Is(err, store.ErrTokenRevoked) {
		t.Fatalf("same key, revoked token: %v, want ErrTokenRevoked", err)
	}
}

func TestRejoinByProof(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	first, err := f.adm.Join(ctx, &admission.Request{Token: f.token(t, time.Hour).String(), CSR: csrFor(t, key), Facts: admission.Facts{Hostname: "gpu-03"}})
	if err != nil {
		t.Fatal(err)
	}
	p := proven(t, first.Node.ID, first.Cert)
	again, err := f.adm.Join(ctx, &admission.Request{Token: f.token(t, time.Hour).String(), CSR: csrFor(t, key),
		Facts: admission.Facts{Hostname: "gpu-03-renamed"}, Proven: p})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Rejoined || again.Node.ID != first.Node.ID || again.RevokedSerial != "" || again.Node.Hostname != "gpu-03-renamed" {
		t.Fatalf("re-join by proof = %+v", again)
	}
	if revoked(t, f.st, first.Cert.Serial) {
		t.Fatal("a re-join that proved the current key revoked the live certificate")
	}
	// That re-join's reply lost, retried with the same token and key: the
	// same node, no further use of the token.
	tok2 := f.token(t, time.Hour)
	req := &admission.Request{Token: tok2.String(), CSR: csrFor(t, key), Facts: admission.Facts{Hostname: "gpu-03"}, Proven: p}
	if _, err := f.adm.Join(ctx, req); err != nil {
		t.Fatal(err)
	}
	again2, err := f.adm.Join(ctx, req)
	if err != nil || !again2.Repeated || again2.Node.ID != first.Node.ID {
		t.Fatalf("repeated re-join by proof = %+v, %v", again2, err)
	}
	if tk, _ := f.st.JoinTokenGet(ctx, tok2.ID()); tk.Uses != 1 {
		t.Fatalf("token uses = %d after a repeated re-join, want 1", tk.Uses)
	}
	// The proof names the first certificate's key: after the node moved to
	// another key, it proves nothing.
	if _, err := f.adm.Renew(ctx, &admission.RenewRequest{NodeID: first.Node.ID, CSR: csr(t)}); err != nil {
		t.Fatal(err)
	}
	_, err = f.adm.Join(ctx, &admission.Request{Token: f.token(t, time.Hour).String(), CSR: csr(t), Facts: admission.Facts{Hostname: "x"}, Proven: p})
	if !errors.Is(err, admission.ErrNotLatestKey) {
		t.Fatalf("proof of an old key: %v, want ErrNotLatestKey", err)
	}
	p.NodeID = "node_gone"
	_, err = f.adm.Join(ctx, &admission.Request{Token: f.token(t, time.Hour).String(), CSR: csr(t), Facts: admission.Facts{Hostname: "x"}, Proven: p})
	if !errors.Is(err, admission.ErrUnknownNode) {
		t.Fatalf("proof for a deleted node: %v, want ErrUnknownNode", err)
	}
}

func TestJoinWithReinstallToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	first, err := f.adm.Join(ctx, &admission.Request{Token: f.token(t, time.Hour).String(), CSR: csr(t),
		Facts: admission.Facts{Hostname: "gpu-04", Labels: map[string]string{"rack": "r7"}}})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := jointoken.New(f.bundle.GatewayPin(), nil)
	if _, err := f.st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: tok.ID(), SecretHash: tok.SecretHash(), PoolID: f.pool.ID,
		MaxUses: 1, ExpiresAt: time.Now().Add(time.Hour), NodeID: first.Node.ID}); err != nil {
		t.Fatal(err)
	}
	// The wiped machine: a new key, new facts, no labels.
	again, err := f.adm.Join(ctx, &admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "gpu-04", MachineID: "new"}})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Rejoined || again.Node.ID != first.Node.ID || again.RevokedSerial != first.Cert.Serial || again.Node.Labels["rack"] != "r7" {
		t.Fatalf("reinstall = %+v %v", again, again.Node.Labels)
	}
	if !revoked(t, f.st, first.Cert.Serial) {
		t.Fatal("the wiped machine's old certificate is not revoked")
	}
	if err := f.st.NodeDelete(ctx, first.Node.ID); err != nil {
		t.Fatal(err)
	}
	tok2, _ := jointoken.New(f.bundle.GatewayPin(), nil)
	if _, err := f.st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: tok2.ID(), SecretHash: tok2.SecretHash(), PoolID: f.pool.ID,
		MaxUses: 1, ExpiresAt: time.Now().Add(time.Hour), NodeID: first.Node.ID}); err != nil {
		t.Fatal(err)
	}
	_, err = f.adm.Join(ctx, &admission.Request{Token: tok2.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "gpu-04"}})
	if !errors.Is(err, admission.ErrUnknownNode) {
		t.Fatalf("reinstall token of a deleted node: %v, want ErrUnknownNode", err)
	}
}

func TestReattest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	var now time.Time
	adm, err := admission.New(admission.Config{NodeCertTTL: time.Hour, ReattestGrace: 24 * time.Hour, Now: func() time.Time { return now }},
		f.st, f.bundle, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	now = time.Now()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	joined, err := adm.Join(ctx, &admission.Request{Token: f.token(t, time.Hour).String(), CSR: csrFor(t, key), Facts: admission.Facts{Hostname: "gpu-05"}})
	if err != nil {
		t.Fatal(err)
	}
	id := joined.Node.ID
	p := proven(t, id, joined.Cert)

	// An outage of 3 certificate lives: inside the grace.
	now = joined.Cert.NotAfter.Add(3 * time.Hour)
	cert, err := adm.Reattest(ctx, &admission.ReattestRequest{Proven: *p, CSR: csrFor(t, key), Source: "192.0.2.9"})
	if err != nil {
		t.Fatalf("reattest inside the grace: %v", err)
	}
	if !cert.NotAfter.After(now) {
		t.Fatalf("re-attested certificate ends %s, before now %s", cert.NotAfter, now)
	}
	n, _ := f.st.NodeGet(ctx, id)
	if n.CertSerial != cert.Serial {
		t.Fatalf("node serial %s, want %s", n.CertSerial, cert.Serial)
	}
	audit, _ := f.st.AuditList(ctx, 0, 100)
	var rows int
	for _, e := range audit {
		if e.Action == admission.ActionReattest && e.Outcome == admission.OutcomeSuccess && e.Resource == "node/"+id {
			rows++
		}
	}
	if rows != 1 {
		t.Fatalf("%d node.reattested success rows, want 1", rows)
	}
	// A re-attestation onto a new key: from then on the old key proves
	// nothing, even inside the grace.
	newKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	cert, err = adm.Reattest(ctx, &admission.ReattestRequest{Proven: *p, CSR: csrFor(t, newKey)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adm.Reattest(ctx, &admission.ReattestRequest{Proven: *p, CSR: csrFor(t, key)}); !errors.Is(err, admission.ErrNotLatestKey) {
		t.Fatalf("old key: %v, want ErrNotLatestKey", err)
	}
	p2 := &admission.ProvenKey{NodeID: id, KeySHA256: cert.KeySHA256, Serial: cert.Serial, NotAfter: cert.NotAfter}
	key = newKey

	// Past the grace.
	now = cert.NotAfter.Add(24*time.Hour + time.Second)
	if _, err := adm.Reattest(ctx, &admission.ReattestRequest{Proven: *p2, CSR: csrFor(t, key)}); !errors.Is(err, admission.ErrGracePassed) {
		t.Fatalf("past the grace: %v, want ErrGracePassed", err)
	}
	// Revoked.
	now = cert.NotAfter.Add(time.Hour)
	if err := f.st.RevocationInsert(ctx, &store.Revocation{Serial: cert.Serial, NodeID: id, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.Reattest(ctx, &admission.ReattestRequest{Proven: *p2, CSR: csrFor(t, key)}); !errors.Is(err, admission.ErrNodeRevoked) {
		t.Fatalf("revoked: %v, want ErrNodeRevoked", err)
	}
	if n, _ := f.st.NodeGet(ctx, id); n.CertSerial != cert.Serial {
		t.Fatal("a refused re-attestation changed the node")
	}
	// Off.
	off, _ := admission.New(admission.Config{NodeCertTTL: time.Hour, Now: func() time.Time { return now }}, f.st, f.bundle, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if _, err := off.Reattest(ctx, &admission.ReattestRequest{Proven: *p2, CSR: csrFor(t, key)}); !errors.Is(err, admission.ErrGracePassed) {
		t.Fatalf("grace 0: %v, want ErrGracePassed", err)
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
	for i, tc := range []struct {
		name  string
		req   admission.Request
		token bool
	}{
		{"no hostname", admission.Request{Token: tok.String(), CSR: csr(t)}, false},
		{"control character", admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "a\nb"}}, false},
		{"long hostname", admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: strings.Repeat("a", 254)}}, false},
		{"too many labels", admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "h", Labels: labels}}, false},
		{"reservation label", admission.Request{Token: tok.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "h",
			Labels: map[string]string{store.ReservationLabelOwner: "me"}}}, false},
		{"big CSR", admission.Request{Token: tok.String(), CSR: make([]byte, admission.MaxCSRSize+1), Facts: admission.Facts{Hostname: "h"}}, false},
		{"expired", admission.Request{Token: f.token(t, -time.Second).String(), CSR: csr(t), Facts: admission.Facts{Hostname: "h"}}, true},
		{"malformed", admission.Request{Token: "nope", CSR: csr(t), Facts: admission.Facts{Hostname: "h"}}, true},
	} {
		// Each from its own address: the refusals of one reason from one
		// address are summarised (TestRefusalsSummarised).
		tc.req.Source = "10.0.0." + strconv.Itoa(i+1)
		_, err := f.adm.Join(ctx, &tc.req)
		if !errors.Is(err, admission.ErrRefused) || admission.IsTokenRefusal(err) != tc.token ||
			errors.Is(err, admission.ErrInvalidRequest) == tc.token {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	entries, _ := f.st.AuditList(ctx, 0, 100)
	if len(entries) != 8 {
		t.Fatalf("%d audit rows for 8 refusals", len(entries))
	}
	if tk, _ := f.st.JoinTokenGet(ctx, tok.ID()); tk.Uses != 0 {
		t.Fatalf("refusals used the token %d times", tk.Uses)
	}
}

// TestRefusalsSummarised: refusals anyone can cause without a good token
// write at most one audit row a minute per source address and reason, the
// next one counting those in between; other sources and reasons have rows
// of their own; a rate-limited Join is one such reason.
func TestRefusalsSummarised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	adm, err := admission.New(admission.Config{NodeCertTTL: time.Hour, Now: func() time.Time { return now }}, f.st, f.bundle,
		slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	malformed := func(source string) {
		t.Helper()
		_, err := adm.Join(ctx, &admission.Request{Token: "nope", CSR: csr(t), Facts: admission.Facts{Hostname: "h"}, Source: source})
		if !errors.Is(err, admission.ErrTokenMalformed) {
			t.Fatalf("malformed token: %v", err)
		}
	}
	rows := func() []*store.AuditEntry {
		t.Helper()
		entries, err := f.st.AuditList(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return entries
	}
	details := func(e *store.AuditEntry) (refusal string, n int) {
		t.Helper()
		var d struct {
			Refusal  string `json:"refusal"`
			Refusals int    `json:"refusals"`
		}
		if err := json.Unmarshal(e.Details, &d); err != nil {
			t.Fatal(err)
		}
		return d.Refusal, d.Refusals
	}
	for range 100 {
		malformed("10.0.0.3")
	}
	if err := adm.RefuseRateLimited(ctx, "10.0.0.3", "gateway:gw_1", time.Second); !errors.Is(err, admission.ErrRateLimited) || !errors.Is(err, admission.ErrRefused) {
		t.Fatalf("RefuseRateLimited: %v", err)
	}
	malformed("10.0.0.4")
	got := rows()
	if len(got) != 3 {
		t.Fatalf("%d audit rows for 100 malformed tokens and a rate-limited join from one address and a malformed one from another, want 3", len(got))
	}
	for i, want := range []struct {
		source, refusal string
	}{{"10.0.0.3", admission.RefusalTokenMalformed}, {"10.0.0.3", admission.RefusalRateLimited}, {"10.0.0.4", admission.RefusalTokenMalformed}} {
		if r, n := details(got[i]); got[i].SourceIP != want.source || r != want.refusal || n != 1 || got[i].Outcome != admission.OutcomeRefused {
			t.Fatalf("row %d: %s %s refusal %q ×%d, want %s refused %s ×1", i, got[i].SourceIP, got[i].Outcome, r, n, want.source, want.refusal)
		}
	}

	// A minute later the next refusal writes the count since the last row.
	now = now.Add(admission.RefusalSummaryEvery)
	malformed("10.0.0.3")
	got = rows()
	if len(got) != 4 {
		t.Fatalf("%d audit rows a minute later, want 4 (the next summary; the pairs with nothing pending write none)", len(got))
	}
	if r, n := details(got[3]); got[3].SourceIP != "10.0.0.3" || r != admission.RefusalTokenMalformed || n != 100 {
		t.Fatalf("the summary a minute later: %s %q ×%d, want 10.0.0.3 token_malformed ×100", got[3].SourceIP, r, n)
	}

	// A pair that goes quiet with refusals pending is written by the
	// sweep after the next window, and forgotten.
	malformed("10.0.0.3")
	now = now.Add(2 * admission.RefusalSummaryEvery)
	malformed("10.0.0.5")
	got = rows()
	if len(got) != 6 {
		t.Fatalf("%d audit rows, want 6 (10.0.0.5's first, and 10.0.0.3's pending one swept)", len(got))
	}
	var swept bool
	for _, e := range got[4:] {
		if r, n := details(e); e.SourceIP == "10.0.0.3" && r == admission.RefusalTokenMalformed && n == 1 {
			swept = true
		}
	}
	if !swept {
		t.Fatal("the pending refusal of a quiet pair was not written by the sweep")
	}
	// The sweep's row starts the pair's window again: its next refusal,
	// right after, waits for the window rather than writing a second row
	// within a minute.
	malformed("10.0.0.3")
	if got = rows(); len(got) != 6 {
		t.Fatalf("%d audit rows after a refusal right after the sweep wrote its pair's row, want 6", len(got))
	}

	// A burst with nothing after it: the timer's sweep (the gateway's
	// flush loop) writes its count a window later.
	for range 5 {
		malformed("10.0.0.6")
	}
	adm.SweepRefusals(ctx) // not yet a window since the last sweep: nothing
	if got = rows(); len(got) != 7 {
		t.Fatalf("%d audit rows after a burst of 5 from a new address, want 7 (its first)", len(got))
	}
	now = now.Add(admission.RefusalSummaryEvery)
	adm.SweepRefusals(ctx)
	got = rows()
	counts := map[string]int{}
	for _, e := range got[7:] {
		_, n := details(e)
		counts[e.SourceIP] += n
	}
	if len(got) != 9 || counts["10.0.0.6"] != 4 || counts["10.0.0.3"] != 1 {
		t.Fatalf("the timer's sweep a window later wrote %d rows %v, want 2: 10.0.0.6 ×4 and 10.0.0.3 ×1", len(got)-7, counts)
	}

	// A gateway that stops writes what is still counted.
	for range 3 {
		malformed("10.0.0.7")
	}
	adm.FlushRefusals(ctx)
	got = rows()
	if len(got) != 11 {
		t.Fatalf("%d audit rows after 3 refusals and a flush, want 11", len(got))
	}
	if r, n := details(got[10]); got[10].SourceIP != "10.0.0.7" || r != admission.RefusalTokenMalformed || n != 2 {
		t.Fatalf("the flush's row: %s %q ×%d, want 10.0.0.7 token_malformed ×2", got[10].SourceIP, r, n)
	}
}

// TestRevokedNodeStaysRevoked: a revoked node is refused its join retried
// with the same token and key (the lost-reply path bcd join --force takes)
// and its re-join by proof, each with a refused audit row naming it; a
// reinstall token made for it brings the machine back as a new node.
func TestRevokedNodeStaysRevoked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	tok := f.token(t, time.Hour)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	first, err := f.adm.Join(ctx, &admission.Request{Token: tok.String(), CSR: csrFor(t, key), Facts: admission.Facts{Hostname: "gpu-05"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.RevocationInsert(ctx, &store.Revocation{Serial: first.Cert.Serial, NodeID: first.Node.ID, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	p := proven(t, first.Node.ID, first.Cert)
	for name, req := range map[string]*admission.Request{
		"same token and key":        {Token: tok.String(), CSR: csrFor(t, key), Facts: admission.Facts{Hostname: "gpu-05"}},
		"same token, key proven":    {Token: tok.String(), CSR: csrFor(t, key), Facts: admission.Facts{Hostname: "gpu-05"}, Proven: p},
		"another token, key proven": {Token: f.token(t, time.Hour).String(), CSR: csrFor(t, key), Facts: admission.Facts{Hostname: "gpu-05"}, Proven: p},
	} {
		_, err := f.adm.Join(ctx, req)
		if !errors.Is(err, admission.ErrNodeRevoked) || !errors.Is(err, admission.ErrRefused) || strings.Contains(err.Error(), "join again") {
			t.Fatalf("%s: %v, want a refusal wrapping ErrNodeRevoked that does not say join again", name, err)
		}
	}
	if n, _ := f.st.NodeGet(ctx, first.Node.ID); n.CertSerial != first.Cert.Serial {
		t.Fatalf("the refused joins changed the node's certificate to %s", n.CertSerial)
	}
	refused := 0
	entries, err := f.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: admission.ActionJoin, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Outcome == admission.OutcomeRefused && strings.Contains(string(e.Details), "is revoked") {
			refused++
		}
	}
	if refused != 3 {
		t.Fatalf("%d refused node.join audit rows saying revoked, want 3", refused)
	}

	reinstall, _ := jointoken.New(f.bundle.GatewayPin(), nil)
	if _, err := f.st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: reinstall.ID(), SecretHash: reinstall.SecretHash(), PoolID: f.pool.ID,
		MaxUses: 1, ExpiresAt: time.Now().Add(time.Hour), NodeID: first.Node.ID}); err != nil {
		t.Fatal(err)
	}
	back, err := f.adm.Join(ctx, &admission.Request{Token: reinstall.String(), CSR: csr(t), Facts: admission.Facts{Hostname: "gpu-05"}, Proven: p})
	if err != nil {
		t.Fatalf("reinstall token of a revoked node: %v", err)
	}
	if back.Rejoined || back.Node.ID == first.Node.ID || len(back.Warnings) != 1 || !strings.Contains(back.Warnings[0], "joined as a new node") {
		t.Fatalf("reinstall of a revoked node = %+v, want a new node with one warning", back)
	}
	if !revoked(t, f.st, first.Cert.Serial) || revoked(t, f.st, back.Cert.Serial) {
		t.Fatal("after the reinstall the old certificate must stay revoked and the new one not be")
	}
}
