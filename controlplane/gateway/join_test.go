package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/jointoken"
	"github.com/better-compute/better-compute/proto/keyproof"
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
		var frozen atomic.Int64
		frozen.Store(time.Now().UnixNano())
		g1 := e.start(func(c *Config) { c.Clock = clock.Reading(func() time.Time { return time.Unix(0, frozen.Load()) }) })
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
		frozen.Add(int64(gatewayListMaxAge))
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

// proofOn answers a Challenge on cc with a KeyProof for purpose by n's key.
func proofOn(t *testing.T, cc *grpc.ClientConn, purpose keyproof.Purpose, n *node) *sessionv1.KeyProof {
	t.Helper()
	var p peer.Peer
	ch, err := sessionv1.NewJoinServiceClient(cc).Challenge(context.Background(), &sessionv1.ChallengeRequest{}, grpc.Peer(&p))
	if err != nil {
		t.Fatalf("challenge: %v", err)
	}
	info := p.AuthInfo.(credentials.TLSInfo)
	ekm, err := keyproof.Exporter(&info.State)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := keyproof.Sign(n.key, purpose, ch.GetNonce(), ekm)
	if err != nil {
		t.Fatal(err)
	}
	return &sessionv1.KeyProof{CertificateChain: n.resp.CertificateChain, Nonce: ch.GetNonce(), Signature: sig}
}

func wantRefusal(t *testing.T, err error, code codes.Code, reason sessionv1.IdentityRefusal) {
	t.Helper()
	wantCode(t, err, code)
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reason.String() && info.GetDomain() == sessionv1.RefusalDomain {
			return
		}
	}
	t.Fatalf("error %v carries no %s", err, reason)
}

// stillHeld fails the test unless n's session s is still the node's
// session and a heartbeat on it goes through.
func (e *env) stillHeld(n *node, s *clientSession) {
	e.t.Helper()
	got, err := e.st.SessionGet(context.Background(), n.id)
	if err != nil || got.SessionID != s.welcome.SessionId {
		e.t.Fatalf("node %s session = %+v (%v), want %s still held", n.id, got, err, s.welcome.SessionId)
	}
	hb := &sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{}}}
	if err := s.stream.Send(hb); err != nil {
		e.t.Fatalf("node %s session ended: %v", n.id, err)
	}
}

// TestRejoinNeedsProof: a name is never proof. The same hostname and
// machine id join as a new node and leave the live node alone; a proof of
// the node's key takes its id without revoking it; a proof captured on one
// connection and replayed on another proves nothing.
func TestRejoinNeedsProof(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		first := e.join(g, "gpu-02", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
		live := e.connect(g, first)

		clone := e.join(g, "gpu-02", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
		if clone.id == first.id || clone.resp.Rejoined || len(clone.resp.Warnings) != 1 || !strings.Contains(clone.resp.Warnings[0], first.id) {
			t.Fatalf("clone joined as %s (rejoined %v, warnings %q), want a new node and a warning naming %s",
				clone.id, clone.resp.Rejoined, clone.resp.Warnings, first.id)
		}
		if !clone.resp.GetServerTime().IsValid() {
			t.Error("JoinResponse carries no server time")
		}
		e.stillHeld(first, live)

		// bcd join --force on the machine itself: a proof of its key.
		cc := e.dial(g, nil)
		_, csr := newKey(t)
		proof := proofOn(t, cc, keyproof.PurposeRejoin, first)
		req := &sessionv1.JoinRequest{Token: e.token(1, time.Hour).String(), Csr: csr, Proof: proof,
			Facts: &sessionv1.NodeFacts{Hostname: "gpu-02", Os: "linux", Arch: "amd64"}}
		resp, err := sessionv1.NewJoinServiceClient(cc).Join(ctx, req)
		if err != nil {
			t.Fatalf("re-join by proof: %v", err)
		}
		if resp.NodeId != first.id || !resp.Rejoined {
			t.Fatalf("re-join by proof gave node %s (rejoined %v), want %s", resp.NodeId, resp.Rejoined, first.id)
		}
		firstLeaf, _ := x509.ParseCertificate(first.resp.CertificateChain[0])
		if revoked, err := e.st.RevocationCheck(ctx, pki.FormatSerial(firstLeaf.SerialNumber)); err != nil || revoked {
			t.Fatalf("re-join by proof revoked the live certificate (%v)", err)
		}
		e.stillHeld(first, live)

		// The captured request, replayed on a new connection.
		before := takeSnapshot(t, e.st)
		req.Token = e.token(1, time.Hour).String()
		before.uses = takeSnapshot(t, e.st).uses
		_, err = sessionv1.NewJoinServiceClient(e.dial(g, nil)).Join(ctx, req)
		wantRefusal(t, err, codes.Unauthenticated, sessionv1.IdentityRefusal_PROOF_INVALID)
		if after := takeSnapshot(t, e.st); after.revocations != before.revocations || after.nodes != before.nodes || !maps.Equal(after.uses, before.uses) {
			t.Fatalf("a replayed re-join changed the store: %+v -> %+v", before, after)
		}
		// A proof made for re-attestation is no proof for a join.
		req.Proof = proofOn(t, cc, keyproof.PurposeReattest, first)
		_, err = sessionv1.NewJoinServiceClient(cc).Join(ctx, req)
		wantRefusal(t, err, codes.Unauthenticated, sessionv1.IdentityRefusal_PROOF_INVALID)
	})
}

// TestReattest: a node whose certificate expired during an outage gets a
// new one on the proof of its key, over a connection without a client
// certificate; a replay on another connection is refused, and so is a
// certificate expired longer ago than the grace.
func TestReattest(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		var now atomic.Pointer[time.Time]
		g := e.start(func(c *Config) {
			c.NodeCertTTL, c.ReattestGrace = time.Hour, 6*time.Hour
			c.Clock = clock.Reading(func() time.Time {
				if p := now.Load(); p != nil {
					return *p
				}
				return time.Now()
			})
		})
		n := e.join(g, "gpu-07", "")
		leaf, _ := x509.ParseCertificate(n.resp.CertificateChain[0])
		// Three certificate lives later.
		later := leaf.NotAfter.Add(3 * time.Hour)
		now.Store(&later)

		cc := e.dial(g, nil)
		_, csr := newKey(t)
		req := &sessionv1.ReattestRequest{Proof: proofOn(t, cc, keyproof.PurposeReattest, n), Csr: csr}
		resp, err := sessionv1.NewJoinServiceClient(cc).Reattest(ctx, req)
		if err != nil {
			t.Fatalf("reattest: %v", err)
		}
		renewed, err := x509.ParseCertificate(resp.CertificateChain[0])
		if err != nil || !renewed.NotAfter.After(later) || resp.GetReattestGrace().AsDuration() != 6*time.Hour {
			t.Fatalf("reattested certificate ends %v (%v), grace %v", renewed.NotAfter, err, resp.GetReattestGrace().AsDuration())
		}
		audit, _ := e.st.AuditList(ctx, 0, 1000)
		if !slices.ContainsFunc(audit, func(a *store.AuditEntry) bool {
			return a.Action == "node.reattested" && a.Outcome == "success" && a.Resource == "node/"+n.id
		}) {
			t.Fatal("no node.reattested audit row")
		}

		// The captured request on another connection.
		before := takeSnapshot(t, e.st)
		_, err = sessionv1.NewJoinServiceClient(e.dial(g, nil)).Reattest(ctx, req)
		wantRefusal(t, err, codes.Unauthenticated, sessionv1.IdentityRefusal_PROOF_INVALID)
		if after := takeSnapshot(t, e.st); after.revocations != before.revocations {
			t.Fatal("a replayed re-attestation revoked something")
		}
		if got, _ := e.st.NodeGet(ctx, n.id); got.CertSerial != pki.FormatSerial(renewed.SerialNumber) {
			t.Fatal("a replayed re-attestation changed the node's certificate")
		}
		// The node moved to the CSR's new key: the old key proves nothing.
		_, err = sessionv1.NewJoinServiceClient(cc).Reattest(ctx, &sessionv1.ReattestRequest{Proof: proofOn(t, cc, keyproof.PurposeReattest, n), Csr: csr})
		wantRefusal(t, err, codes.PermissionDenied, sessionv1.IdentityRefusal_NOT_LATEST_KEY)

		// Past the grace.
		m := e.join(g, "gpu-08", "")
		mLeaf, _ := x509.ParseCertificate(m.resp.CertificateChain[0])
		past := mLeaf.NotAfter.Add(6*time.Hour + time.Minute)
		now.Store(&past)
		_, err = sessionv1.NewJoinServiceClient(cc).Reattest(ctx, &sessionv1.ReattestRequest{Proof: proofOn(t, cc, keyproof.PurposeReattest, m), Csr: csr})
		wantRefusal(t, err, codes.FailedPrecondition, sessionv1.IdentityRefusal_GRACE_PASSED)
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

		// A refusal of a reason already audited from this address within
		// the minute writes no row of its own: the next summary counts it
		// (admission.RefusalSummaryEvery).
		for _, tc := range []struct {
			name       string
			token      string
			csr        []byte
			code       codes.Code
			message    string
			summarised bool
		}{
			{"expired", expired.String(), csr, codes.Unauthenticated, "join token expired", false},
			{"exhausted", exhausted.String(), csr, codes.Unauthenticated, "join token used up", false},
			{"revoked", revoked.String(), csr, codes.Unauthenticated, "join token revoked", false},
			{"unknown", unknown.String(), csr, codes.Unauthenticated, "join token unknown", false},
			{"wrong secret", forged, csr, codes.Unauthenticated, "join token unknown", true},
			{"malformed", "bct1.not-a-token", csr, codes.Unauthenticated, "join token malformed", false},
			{"garbage CSR", valid.String(), []byte("not a certificate request"), codes.InvalidArgument, "invalid certificate signing request", false},
			{"empty CSR", valid.String(), nil, codes.InvalidArgument, "invalid certificate signing request", true},
		} {
			before := takeSnapshot(t, e.st)
			_, err := client.Join(ctx, &sessionv1.JoinRequest{Token: tc.token, Csr: tc.csr, Facts: &sessionv1.NodeFacts{Hostname: "refused-" + tc.name}})
			st := wantCode(t, err, tc.code)
			if !strings.Contains(st.Message(), tc.message) {
				t.Errorf("%s: message %q, want it to say %q", tc.name, st.Message(), tc.message)
			}
			after := takeSnapshot(t, e.st)
			rows := 1
			if tc.summarised {
				rows = 0
			}
			if after.nodes != before.nodes || after.revocations != before.revocations || after.sessions != before.sessions ||
				!mapsEqual(after.uses, before.uses) || after.audits != before.audits+rows {
				t.Errorf("%s: wrote more than %d audit rows: before %+v, after %+v", tc.name, rows, before, after)
			}
			if tc.summarised {
				continue
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
		feed := &feedReads{Store: b.open(t), reads: make(chan struct{}, 64)}
		e := newEnv(t, feed)
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
		feed.applied(t, g)
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
			sealed, err := pki.Seal(testSecret, []byte("value of "+name), pki.SecretAAD(name))
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
		// Another node's secret opens once with a grant for one command
		// (a site's BMC agent driving a silent node's BMC), never after
		// it is used or expired.
		for _, g := range []store.SecretGrantParams{{Name: "bmc/mine", NodeID: other.id, CommandID: "cmd_1", ExpiresAt: time.Now().Add(time.Minute)},
			{Name: "bmc/mine", NodeID: other.id, CommandID: "cmd_old", ExpiresAt: time.Now().Add(-time.Minute)}} {
			if err := e.st.SecretGrant(ctx, &g); err != nil {
				t.Fatal(err)
			}
		}
		got, err = otherClient.Secret(ctx, &sessionv1.SecretRequest{Name: "bmc/mine"})
		if err != nil || string(got.Value) != "value of bmc/mine" {
			t.Fatalf("granted secret = %v, %v", got, err)
		}
		_, err = otherClient.Secret(ctx, &sessionv1.SecretRequest{Name: "bmc/mine"})
		wantCode(t, err, codes.NotFound)
		entries, _ := e.st.AuditList(ctx, 0, 1000)
		var actions []string
		for _, a := range entries {
			actions = append(actions, a.Action+":"+a.Outcome)
		}
		for _, want := range []string{"node.renew:success", "node.renew:refused", "secret.read:success", "secret.read:refused", "secret.read-granted:success"} {
			if !slices.Contains(actions, want) {
				t.Errorf("audit log %v lacks %s", actions, want)
			}
		}
	})
}

// TestJoinRateLimited: past its source's Join rate a Join is refused with
// RESOURCE_EXHAUSTED, a retry-after-ms trailer and a RetryInfo detail
// saying how long to wait; FakeDaemons (session.Join, as bcd join) joining
// from that address at once all get in, retrying after the hint.
func TestJoinRateLimited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sqlitetest.Open(t))
	g := e.start(func(c *Config) { c.JoinRate = 4; c.JoinBurst = 2 })
	client := sessionv1.NewJoinServiceClient(e.dial(g, nil))
	_, csr := newKey(t)
	var err error
	var trailer metadata.MD
	for range 3 {
		_, err = client.Join(ctx, &sessionv1.JoinRequest{Token: "bct1.not-a-token", Csr: csr, Facts: &sessionv1.NodeFacts{Hostname: "flood"}},
			grpc.Trailer(&trailer))
		if status.Code(err) == codes.ResourceExhausted {
			break
		}
		wantCode(t, err, codes.Unauthenticated)
	}
	st := wantCode(t, err, codes.ResourceExhausted)
	var hint time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			hint = ri.GetRetryDelay().AsDuration()
		}
	}
	if hint <= 0 || hint > time.Second/2 || len(trailer.Get(TrailerRetryAfter)) != 1 || !strings.Contains(st.Message(), "retry in") {
		t.Fatalf("refusal %q, RetryInfo %s, trailer %v: want how long to wait (at most two tokens: 500 ms at 4 a second)", st.Message(), hint, trailer)
	}

	tok := e.token(6, time.Hour)
	errs := make(chan error, 6)
	for i := range 6 {
		go func() {
			d, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: fmt.Sprintf("rate-%d", i), NoInventory: true})
			if err == nil {
				jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err = d.Join(jctx, g.PublicURL(), tok.String())
				cancel()
			}
			errs <- err
		}()
	}
	for range 6 {
		if err := <-errs; err != nil {
			t.Fatalf("a FakeDaemon joining beside others from one address at 4 a second: %v", err)
		}
	}
}

// feedReads is a store that signals each read of the revocation feed once
// it has returned.
type feedReads struct {
	store.Store
	reads chan struct{}
}

func (f *feedReads) RevocationList(ctx context.Context, since time.Time) ([]*store.Revocation, error) {
	revs, err := f.Store.RevocationList(ctx, since)
	select {
	case f.reads <- struct{}{}:
	default:
	}
	return revs, err
}

// applied returns once g has read the feed, and acted on what it read,
// after every revocation written before the call: of three reads that
// return after the call, the second began after the first returned (so
// after the call) and the third after the second's revocations were
// applied (the loop reads and applies in turn). Each read is asked for
// at once (RevokeNow) rather than waited for.
func (f *feedReads) applied(t *testing.T, g *running) {
	t.Helper()
	for {
		select {
		case <-f.reads:
			continue
		default:
		}
		break
	}
	for range 3 {
		g.RevokeNow("")
		select {
		case <-f.reads:
		case <-deadline(t, 20*time.Second):
			t.Fatal("the gateway did not read the revocation feed")
		}
	}
}
