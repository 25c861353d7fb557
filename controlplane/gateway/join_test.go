package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/better-compute/better-compute/controlplane/admission"
	"github.com/better-compute/better-compute/controlplane/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/jointoken"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// listCounting is the real store, counting GatewayList reads.
type listCounting struct {
	store.Store
	lists atomic.Int64
}

func (c *listCounting) GatewayList(ctx context.Context) ([]*store.Gateway, error) {
	c.lists.Add(1)
	return c.Store.GatewayList(ctx)
}

// TestJoinGatewayListCached: joins read the gateways table once a second
// at most, by the gateway's clock, so a gateway started meanwhile is in the
// answers from the first join a second later.
func TestJoinGatewayListCached(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		st := &listCounting{Store: b.open(t)}
		e := newEnv(t, st)
		// g1's clock stands still until the test moves it.
		var clock atomic.Int64
		clock.Store(time.Now().UnixNano())
		g1 := e.start(func(c *Config) { c.Now = func() time.Time { return time.Unix(0, clock.Load()) } })
		gateways := func(hostname string) []string { return e.join(g1, hostname, "").resp.Gateways }
		base := st.lists.Load()
		if got := gateways("gpu-60"); !slices.Equal(got, []string{g1.PublicURL()}) {
			t.Fatalf("gateways = %v, want [%s]", got, g1.PublicURL())
		}
		g2 := e.start(nil)
		// Within the second, joins answer from the list read first.
		for i := range 5 {
			if got := gateways(fmt.Sprintf("gpu-61%d", i)); !slices.Equal(got, []string{g1.PublicURL()}) {
				t.Fatalf("join %d within the second: gateways = %v, want the list read first", i, got)
			}
		}
		if reads := st.lists.Load() - base; reads != 1 {
			t.Fatalf("6 joins within a second read the gateways table %d times, want 1", reads)
		}
		clock.Add(int64(gatewayListMaxAge))
		if got := gateways("gpu-62"); !slices.Equal(got, []string{g1.PublicURL(), g2.PublicURL()}) {
			t.Fatalf("a second on: gateways = %v, want %s then %s", got, g1.PublicURL(), g2.PublicURL())
		}
		if reads := st.lists.Load() - base; reads != 2 {
			t.Fatalf("the gateways table read %d times, want 2", reads)
		}
	})
}

func TestJoin(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		tok := e.token(2, time.Hour)
		n := e.joinWith(g, tok, "gpu-01", "0123456789abcdef0123456789abcdef")

		r := n.resp
		if pki.ValidateNodeID(r.NodeId) != nil || r.TrustDomain != testTrustDomain ||
			r.SpiffeId != pki.NodeSPIFFEID(testTrustDomain, r.NodeId) || r.PoolId != e.pool.ID || r.SiteId != e.site.ID ||
			r.Region != "eu-1" || len(r.CertificateChain) != 1 || len(r.NodeCaRoots) != 1 {
			t.Fatalf("join response = %+v", r)
		}
		if len(r.Gateways) == 0 || r.Gateways[0] != g.PublicURL() {
			t.Fatalf("gateways = %v, want this gateway (%s) first", r.Gateways, g.PublicURL())
		}
		leaf, err := x509.ParseCertificate(r.CertificateChain[0])
		if err != nil {
			t.Fatal(err)
		}
		if len(leaf.DNSNames) != 0 || len(leaf.URIs) != 1 || leaf.URIs[0].String() != r.SpiffeId {
			t.Fatalf("certificate names %v %v: the CSR's names must be ignored", leaf.DNSNames, leaf.URIs)
		}
		if !r.RenewAfter.AsTime().After(time.Now()) || !r.RenewAfter.AsTime().Before(leaf.NotAfter) {
			t.Fatalf("renew after %v, not after %v", r.RenewAfter.AsTime(), leaf.NotAfter)
		}
		// The certificate verifies against the roots it came with.
		if id, _, err := e.bundle.VerifyNode([]*x509.Certificate{leaf}, time.Now()); err != nil || id != r.NodeId {
			t.Fatalf("verify issued certificate: %q %v", id, err)
		}
		nd, err := e.st.NodeGet(ctx, r.NodeId)
		if err != nil {
			t.Fatal(err)
		}
		if nd.PoolID != e.pool.ID || nd.Hostname != "gpu-01" || nd.State != store.NodeJoined || nd.CertSerial != pki.FormatSerial(leaf.SerialNumber) ||
			nd.Labels["rack"] != "r1" || nd.BCDVersion != "0.1.0" {
			t.Fatalf("node = %+v", nd)
		}
		if used, _ := e.st.JoinTokenGet(ctx, tok.ID()); used.Uses != 1 {
			t.Fatalf("token uses = %d, want 1", used.Uses)
		}
		entries, err := e.st.AuditList(ctx, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Action != admission.ActionJoin || entries[0].Outcome != admission.OutcomeSuccess ||
			entries[0].SourceIP != "127.0.0.1" || entries[0].Resource != "node/"+r.NodeId {
			t.Fatalf("audit = %+v", entries)
		}
	})
}

func TestRejoinKeepsNodeAndRevokesOldCertificate(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		first := e.join(g, "gpu-02", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
		// Reinstalled: same machine id, new hostname and key, fresh token.
		second := e.join(g, "gpu-02-reinstalled", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
		if second.id != first.id {
			t.Fatalf("re-join by machine id gave node %s, want %s", second.id, first.id)
		}
		// Same hostname, no machine id.
		third := e.join(g, "gpu-02-reinstalled", "")
		if third.id != first.id {
			t.Fatalf("re-join by hostname gave node %s, want %s", third.id, first.id)
		}
		firstLeaf, _ := x509.ParseCertificate(first.resp.CertificateChain[0])
		revoked, err := e.st.RevocationCheck(ctx, pki.FormatSerial(firstLeaf.SerialNumber))
		if err != nil || !revoked {
			t.Fatalf("old certificate revoked = %v (%v), want true", revoked, err)
		}
		nodes, _ := e.st.NodeList(ctx, &store.NodeListParams{})
		if len(nodes) != 1 || nodes[0].Labels["rack"] != "r1" {
			t.Fatalf("nodes = %+v, want the one node", nodes)
		}
		// The old certificate cannot connect any more; the new one can.
		if _, err := e.tryConnect(g, &first.cert); err == nil {
			t.Fatal("the replaced certificate still connects")
		} else {
			wantCode(t, err, codes.PermissionDenied)
		}
		e.connect(g, third)
	})
}

// snapshot is everything a refused join must leave alone.
type snapshot struct {
	nodes, revocations, audits, sessions int
	uses                                 map[string]int
}

func takeSnapshot(t *testing.T, st store.Store) snapshot {
	t.Helper()
	ctx := context.Background()
	nodes, _ := st.NodeList(ctx, &store.NodeListParams{})
	revs, _ := st.RevocationList(ctx, time.Time{})
	audits, _ := st.AuditList(ctx, 0, 1000)
	sessions, _ := st.SessionList(ctx, "")
	tokens, _ := st.JoinTokenList(ctx, &store.ListParams{})
	s := snapshot{nodes: len(nodes), revocations: len(revs), audits: len(audits), sessions: len(sessions), uses: map[string]int{}}
	for _, tk := range tokens {
		s.uses[tk.ID] = tk.Uses
	}
	return s
}

func TestJoinRefused(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		client := sessionv1.NewJoinServiceClient(e.dial(g, nil))
		_, csr := newKey(t)

		expired := e.token(5, -time.Minute)
		exhausted := e.token(1, time.Hour)
		e.joinWith(g, exhausted, "first-user", "")
		revoked := e.token(5, time.Hour)
		if err := e.st.JoinTokenRevoke(ctx, revoked.ID()); err != nil {
			t.Fatal(err)
		}
		unknown, _ := jointoken.New(e.bundle.GatewayPin(), nil)
		valid := e.token(5, time.Hour)
		wrongSecret, _ := jointoken.New(e.bundle.GatewayPin(), nil)
		forged := strings.Replace(wrongSecret.String(), wrongSecret.ID(), valid.ID(), 1)

		for _, tc := range []struct {
			name    string
			token   string
			csr     []byte
			code    codes.Code
			message string
		}{
			{"expired", expired.String(), csr, codes.Unauthenticated, "join token expired"},
			{"exhausted", exhausted.String(), csr, codes.Unauthenticated, "join token used up"},
			{"revoked", revoked.String(), csr, codes.Unauthenticated, "join token revoked"},
			{"unknown", unknown.String(), csr, codes.Unauthenticated, "join token unknown"},
			{"wrong secret", forged, csr, codes.Unauthenticated, "join token unknown"},
			{"malformed", "bct1.not-a-token", csr, codes.Unauthenticated, "join token malformed"},
			{"garbage CSR", valid.String(), []byte("not a certificate request"), codes.InvalidArgument, "invalid certificate signing request"},
			{"empty CSR", valid.String(), nil, codes.InvalidArgument, "invalid certificate signing request"},
		} {
			before := takeSnapshot(t, e.st)
			_, err := client.Join(ctx, &sessionv1.JoinRequest{Token: tc.token, Csr: tc.csr, Facts: &sessionv1.NodeFacts{Hostname: "refused-" + tc.name}})
			st := wantCode(t, err, tc.code)
			if !strings.Contains(st.Message(), tc.message) {
				t.Errorf("%s: message %q, want it to say %q", tc.name, st.Message(), tc.message)
			}
			after := takeSnapshot(t, e.st)
			if after.nodes != before.nodes || after.revocations != before.revocations || after.sessions != before.sessions ||
				!mapsEqual(after.uses, before.uses) || after.audits != before.audits+1 {
				t.Errorf("%s: wrote more than one audit row: before %+v, after %+v", tc.name, before, after)
			}
			entries, _ := e.st.AuditList(ctx, 0, 1000)
			last := entries[len(entries)-1]
			var details map[string]any
			_ = json.Unmarshal(last.Details, &details)
			if last.Action != admission.ActionJoin || last.Outcome != admission.OutcomeRefused || last.SourceIP != "127.0.0.1" || details["reason"] == "" {
				t.Errorf("%s: audit row %+v %s", tc.name, last, last.Details)
			}
		}
		// Facts out of bounds are refused the same way.
		_, err := client.Join(ctx, &sessionv1.JoinRequest{Token: valid.String(), Csr: csr, Facts: &sessionv1.NodeFacts{}})
		wantCode(t, err, codes.InvalidArgument)
		if tk, _ := e.st.JoinTokenGet(ctx, valid.ID()); tk.Uses != 0 {
			t.Fatalf("refused joins used the token %d times", tk.Uses)
		}
	})
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestConcurrentJoinsAdmitMaxUses(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		tok := e.token(8, time.Hour)
		client := sessionv1.NewJoinServiceClient(e.dial(g, nil))
		errs := make(chan error, 20)
		for i := range 20 {
			go func() {
				_, csr := newKey(t)
				_, err := client.Join(context.Background(), &sessionv1.JoinRequest{Token: tok.String(), Csr: csr,
					Facts: &sessionv1.NodeFacts{Hostname: "host-" + string(rune('a'+i))}})
				errs <- err
			}()
		}
		admitted := 0
		for range 20 {
			if err := <-errs; err == nil {
				admitted++
			} else {
				wantCode(t, err, codes.Unauthenticated)
			}
		}
		if admitted != 8 {
			t.Fatalf("20 concurrent joins with max-uses 8 admitted %d", admitted)
		}
	})
}

func TestRenewAndSecret(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		n := e.join(g, "gpu-03", "")
		other := e.join(g, "gpu-04", "")
		cc := e.dial(g, &n.cert)
		client := sessionv1.NewJoinServiceClient(cc)

		// Without a client certificate Renew is refused.
		_, csr := newKey(t)
		_, err := sessionv1.NewJoinServiceClient(e.dial(g, nil)).Renew(ctx, &sessionv1.RenewRequest{Csr: csr})
		wantCode(t, err, codes.Unauthenticated)
		_, err = client.Renew(ctx, &sessionv1.RenewRequest{Csr: []byte("junk")})
		wantCode(t, err, codes.InvalidArgument)

		s := e.connect(g, n)
		resp, err := client.Renew(ctx, &sessionv1.RenewRequest{Csr: csr})
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(resp.CertificateChain[0])
		serial := pki.FormatSerial(leaf.SerialNumber)
		if nd, _ := e.st.NodeGet(ctx, n.id); nd.CertSerial != serial || leaf.Subject.CommonName != n.id {
			t.Fatalf("node serial %s, renewed %s for %s", nd.CertSerial, serial, leaf.Subject.CommonName)
		}
		// Revoking the replaced certificate leaves the session up; it now
		// answers to the new serial.
		oldLeaf, _ := x509.ParseCertificate(n.resp.CertificateChain[0])
		if err := e.st.RevocationInsert(ctx, &store.Revocation{Serial: pki.FormatSerial(oldLeaf.SerialNumber)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		if err := s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{}}}); err != nil {
			t.Fatalf("session ended after the replaced certificate was revoked: %v", err)
		}
		if g.Sessions() != 1 {
			t.Fatalf("sessions = %d, want 1", g.Sessions())
		}

		// Secret: granted to the caller only.
		for name, owner := range map[string]string{"bmc/ipmi": other.id, "bmc/mine": ""} {
			if owner == "" {
				owner = n.id
			}
			sealed, err := pki.Seal(testSecret, []byte("value of "+name), SecretAAD(name))
			if err != nil {
				t.Fatal(err)
			}
			if err := e.st.SecretPut(ctx, &store.Secret{Name: name, NodeID: owner, Sealed: sealed}); err != nil {
				t.Fatal(err)
			}
		}
		otherClient := sessionv1.NewJoinServiceClient(e.dial(g, &other.cert))
		got, err := otherClient.Secret(ctx, &sessionv1.SecretRequest{Name: "bmc/ipmi"})
		if err != nil || string(got.Value) != "value of bmc/ipmi" {
			t.Fatalf("secret = %v, %v", got, err)
		}
		_, err = otherClient.Secret(ctx, &sessionv1.SecretRequest{Name: "bmc/mine"})
		wantCode(t, err, codes.NotFound)
		_, err = otherClient.Secret(ctx, &sessionv1.SecretRequest{Name: "missing"})
		wantCode(t, err, codes.NotFound)
		entries, _ := e.st.AuditList(ctx, 0, 1000)
		var actions []string
		for _, a := range entries {
			actions = append(actions, a.Action+":"+a.Outcome)
		}
		for _, want := range []string{"node.renew:success", "node.renew:refused", "secret.read:success", "secret.read:refused"} {
			if !slices.Contains(actions, want) {
				t.Errorf("audit log %v lacks %s", actions, want)
			}
		}
	})
}
