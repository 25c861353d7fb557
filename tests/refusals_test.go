package tests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/jointoken"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestJoinRefused checks, on each backend against a real serve, that every
// refusal says clearly why and writes nothing but its audit row: bcd join
// with an expired, used-up, revoked and unknown token; a Join with a garbage
// CSR; Connect with a certificate of another CA, with one a node minted for
// another node from its own certificate, and with one of this CA naming a
// node that is not in the deployment.
func TestJoinRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := context.Background()
		d := newDeployment(t, backend)
		bundle, err := bootstrap.LoadBundle(ctx, d.st, d.secret())
		if err != nil {
			t.Fatal(err)
		}

		// Two machines join with a token of two uses: the token is used
		// up, and the nodes serve the certificate checks below.
		usedUp, usedUpID := d.joinToken(2, time.Hour)
		holder, victim := newMachine(t, "holder"), newMachine(t, "victim")
		holderID := holder.mustJoin(d.gatewayURL, usedUp)
		victimID := victim.mustJoin(d.gatewayURL, usedUp)

		// joinTokens.create makes no token that lives under a minute: an
		// expired one is minted in the database, as the API would have.
		pool, err := d.st.PoolGet(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		expiredTok, expiredRec, err := api.CreateJoinToken(ctx, d.st, bundle.GatewayPin(), pool.ID, -time.Second, 1, "expired", "")
		if err != nil {
			t.Fatal(err)
		}
		expired, expiredID := filepath.Join(t.TempDir(), "join-token"), expiredRec.ID
		if err := os.WriteFile(expired, []byte(expiredTok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var tokens struct{ JoinTokens []struct{ ID, State string } }
		d.cliJSON(&tokens, "join-tokens", "list")
		if i := slices.IndexFunc(tokens.JoinTokens, func(t struct{ ID, State string }) bool { return t.ID == expiredID }); i < 0 ||
			tokens.JoinTokens[i].State != "expired" {
			t.Fatalf("join-tokens list = %+v, want %s expired", tokens, expiredID)
		}

		revoked, revokedID := d.joinToken(1, time.Hour)
		d.cli("join-tokens", "revoke", revokedID)

		unknownTok, err := jointoken.New(bundle.GatewayPin(), nil)
		if err != nil {
			t.Fatal(err)
		}
		unknown := filepath.Join(t.TempDir(), "join-token")
		if err := os.WriteFile(unknown, []byte(unknownTok.String()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}

		for _, tc := range []struct {
			name, file, tokenID string
			want, audit         string // what bcd join says, what the audit row's reason says
		}{
			{"expired", expired, expiredID, "join token expired", "join token expired"},
			{"used-up", usedUp, usedUpID, "join token used up", "join token exhausted"},
			{"revoked", revoked, revokedID, "join token revoked", "join token revoked"},
			{"unknown", unknown, unknownTok.ID(), "join token unknown", "join token unknown"},
		} {
			m := newMachine(t, "refused-"+tc.name)
			before := d.snapshot()
			code, stdout, stderr := m.join(d.gatewayURL, tc.file)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if code != 1 || len(lines) != 1 || !strings.HasPrefix(lines[0], "bcd: ") || !strings.Contains(stderr, tc.want) || stdout != "" {
				t.Fatalf("%s token: bcd join exit %d, stdout %q, stderr %q; want exit 1 and one line saying %q",
					tc.name, code, stdout, stderr, tc.want)
			}
			if m.joined() {
				t.Fatalf("%s token: bcd join wrote an identity", tc.name)
			}
			d.wantOnlyJoinAudit(before, tc.tokenID, tc.audit)
		}

		// A garbage CSR with a good token: INVALID_ARGUMENT saying so.
		good, goodID := d.joinToken(1, time.Hour)
		goodTok, err := os.ReadFile(good)
		if err != nil {
			t.Fatal(err)
		}
		before := d.snapshot()
		cc := d.dial(t, bundle, nil)
		_, err = sessionv1.NewJoinServiceClient(cc).Join(ctx, &sessionv1.JoinRequest{
			Token: strings.TrimSpace(string(goodTok)), Csr: []byte("not a certificate request"),
			Facts: &sessionv1.NodeFacts{Hostname: "garbage-csr", Os: runtime.GOOS, Arch: runtime.GOARCH},
		})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "invalid certificate signing request") {
			t.Fatalf("Join with a garbage CSR: %v; want INVALID_ARGUMENT saying the certificate signing request is invalid", err)
		}
		d.wantOnlyJoinAudit(before, goodID, "invalid certificate signing request")
		if tok, err := d.st.JoinTokenGet(ctx, goodID); err != nil || tok.Uses != 0 {
			t.Fatalf("the token of a refused join: %+v (%v), want unused", tok, err)
		}

		// Certificates that must not open a session; none writes anything.
		before = d.snapshot()
		holderCert, err := tls.LoadX509KeyPair(filepath.Join(holder.dataDir, "node.crt"), filepath.Join(holder.dataDir, "node.key"))
		if err != nil {
			t.Fatal(err)
		}
		handshakeRefusals := func() int { return countLines(d.serve, regexpTLSRefused) }
		refusedBefore := handshakeRefusals()

		// Another CA's certificate for a real node: the handshake fails.
		other, err := pki.Init(pki.InitOptions{TrustDomain: bundle.TrustDomain})
		if err != nil {
			t.Fatal(err)
		}
		key, csr := newKeyCSR(t)
		foreign, err := other.IssueNode(csr, victimID, pki.IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		err = d.connect(t, bundle, &tls.Certificate{Certificate: [][]byte{foreign.CertDER}, PrivateKey: key})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("Connect with another CA's certificate: %v; want the handshake refused (UNAVAILABLE)", err)
		}

		// A certificate naming the victim, minted by the holder with its
		// own node certificate and key as if it were a CA: the chain does
		// not verify, the handshake fails.
		minted := mintFromNode(t, holderCert, bundle.TrustDomain, victimID)
		err = d.connect(t, bundle, &tls.Certificate{Certificate: [][]byte{minted, holderCert.Certificate[0]}, PrivateKey: holderCert.PrivateKey})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("Connect with a certificate the holder minted for node %s: %v; want the handshake refused", victimID, err)
		}
		eventually(t, 5*time.Second, func() bool { return handshakeRefusals() >= refusedBefore+2 },
			func() string { return "serve did not log both refused handshakes" })

		// This CA's certificate naming a node that is not in the deployment.
		stranger := store.NewID("node")
		stray, err := bundle.IssueNode(csr, stranger, pki.IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		err = d.connect(t, bundle, &tls.Certificate{Certificate: [][]byte{stray.CertDER}, PrivateKey: key})
		if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), stranger) {
			t.Fatalf("Connect with a certificate naming node %s, not of this deployment: %v; want PERMISSION_DENIED naming it", stranger, err)
		}

		if after := d.snapshot(); after != before {
			t.Fatalf("refused connects wrote something:\nbefore %+v\nafter  %+v", before, after)
		}

		// The holder's own certificate opens a session: the refusals above
		// were about the certificates, not the way the test connects.
		if err := d.connect(t, bundle, &holderCert); err != nil {
			t.Fatalf("Connect with the holder's own certificate: %v", err)
		}
		t.Logf("%s: holder %s, victim %s, stranger %s", backend, holderID, victimID, stranger)
	})
}

// regexpTLSRefused is the gateway's log line for a refused handshake.
var regexpTLSRefused = regexp.MustCompile(`msg="TLS handshake refused"`)

// snapshot is what a refused join or connect must leave as it was.
type snapshot struct {
	nodes     string // ids, hostnames and certificate serials
	tokens    string // ids and uses
	sessions  int
	revoked   int
	audit     int64 // the last audit row's id
	auditRows int
}

func (d *deployment) snapshot() snapshot {
	d.t.Helper()
	ctx := context.Background()
	var s snapshot
	nodes, err := d.st.NodeList(ctx, &store.NodeListParams{ListParams: store.ListParams{Limit: store.MaxListLimit}})
	if err != nil {
		d.t.Fatal(err)
	}
	for _, n := range nodes {
		s.nodes += fmt.Sprintf("%s %s %s %s;", n.ID, n.Hostname, n.CertSerial, n.State)
	}
	tokens, err := d.st.JoinTokenList(ctx, &store.ListParams{Limit: store.MaxListLimit})
	if err != nil {
		d.t.Fatal(err)
	}
	for _, t := range tokens {
		s.tokens += fmt.Sprintf("%s %d;", t.ID, t.Uses)
	}
	sessions, err := d.st.SessionList(ctx, "")
	if err != nil {
		d.t.Fatal(err)
	}
	s.sessions = len(sessions)
	revs, err := d.st.RevocationList(ctx, time.Time{})
	if err != nil {
		d.t.Fatal(err)
	}
	s.revoked = len(revs)
	for {
		page, err := d.st.AuditList(ctx, s.audit, store.MaxListLimit)
		if err != nil {
			d.t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		s.auditRows += len(page)
		s.audit = page[len(page)-1].ID
	}
	return s
}

// wantOnlyJoinAudit checks that, since before, exactly one row was written:
// a refused node.join audit row for tokenID from 127.0.0.1 whose reason
// says reason.
func (d *deployment) wantOnlyJoinAudit(before snapshot, tokenID, reason string) {
	d.t.Helper()
	after := d.snapshot()
	if after.auditRows != before.auditRows+1 {
		d.t.Fatalf("%d audit rows written, want exactly 1", after.auditRows-before.auditRows)
	}
	rest, want := after, before
	rest.audit, rest.auditRows, want.audit, want.auditRows = 0, 0, 0, 0
	if !reflect.DeepEqual(rest, want) {
		d.t.Fatalf("a refused join changed more than the audit log:\nbefore %+v\nafter  %+v", before, after)
	}
	rows, err := d.st.AuditList(context.Background(), before.audit, 10)
	if err != nil {
		d.t.Fatal(err)
	}
	e := rows[0]
	var details struct {
		TokenID string `json:"tokenId"`
		Reason  string `json:"reason"`
	}
	if err := json.Unmarshal(e.Details, &details); err != nil {
		d.t.Fatalf("audit details %s: %v", e.Details, err)
	}
	if e.Action != admission.ActionJoin || e.Outcome != admission.OutcomeRefused || e.SourceIP != "127.0.0.1" ||
		e.Resource != "join-token/"+tokenID || details.TokenID != tokenID || !strings.Contains(details.Reason, reason) {
		d.t.Fatalf("audit row %d: %s %s %s from %q, details %s; want a refused %s of token %s from 127.0.0.1 saying %q",
			e.ID, e.Action, e.Resource, e.Outcome, e.SourceIP, e.Details, admission.ActionJoin, tokenID, reason)
	}
}

// dial opens a gRPC connection to the gateway, trusting the deployment's
// gateway CA, presenting cert when given.
func (d *deployment) dial(t *testing.T, b *pki.Bundle, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(b.GatewayCA.Cert)
	cfg := &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS13}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	u, err := url.Parse(d.gatewayURL)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("127.0.0.1:"+u.Port(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// connect opens a session with cert: Hello, then the first answer. It
// returns nil on Welcome and closes the connection either way.
func (d *deployment) connect(t *testing.T, b *pki.Bundle, cert *tls.Certificate) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cc := d.dial(t, b, cert)
	defer cc.Close()
	stream, err := sessionv1.NewSessionServiceClient(cc).Connect(ctx)
	if err != nil {
		return err
	}
	_ = stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Hello{Hello: &sessionv1.Hello{
		BcdVersion: "0.0.0-e2e", Os: runtime.GOOS, Arch: runtime.GOARCH}}})
	msg, err := stream.Recv()
	if err != nil {
		return err
	}
	if msg.GetWelcome() == nil {
		return fmt.Errorf("first answer %v, want Welcome", msg)
	}
	return nil
}

// newKeyCSR makes a P-256 key and a certificate request for it.
func newKeyCSR(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "e2e"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, csr
}

// mintFromNode signs, with a node's own key and certificate as issuer, a
// client certificate for that key naming nodeID: what a node that wants to
// pass for another could make without the CA.
func mintFromNode(t *testing.T, node tls.Certificate, trustDomain, nodeID string) []byte {
	t.Helper()
	parent, err := x509.ParseCertificate(node.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	spiffe, err := url.Parse(pki.NodeSPIFFEID(trustDomain, nodeID))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: nodeID},
		URIs:         []*url.URL{spiffe},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	key := node.PrivateKey.(*ecdsa.PrivateKey)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
