package sessiontest

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/proto/keyproof"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/proto/jointoken"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// GatewayOptions configures a Gateway. Zero values take the defaults named.
type GatewayOptions struct {
	// ID is Welcome.gateway_id. Defaults to "gw-test".
	ID string
	// HeartbeatInterval is sent in Welcome. Defaults to 50 ms.
	HeartbeatInterval time.Duration
	// CertTTL is the life of node certificates from Join and Renew.
	// Defaults to 1 h.
	CertTTL time.Duration
	// ReattestRefused makes Reattest refuse every valid proof with
	// GRACE_PASSED, as a gateway does once the grace is over.
	ReattestRefused bool
	// RenewAfter, when set, is sent as renew_after this long after issue;
	// otherwise two thirds of CertTTL.
	RenewAfter time.Duration
	// Tokens are the join tokens Join accepts, each any number of times.
	// Defaults to none: add them with AddToken.
	Tokens []string
	// MaxSessions, when set, refuses Connect beyond this many open sessions
	// with RESOURCE_EXHAUSTED and a retry hint of RetryAfter.
	MaxSessions int
	// RetryAfter is the retry hint sent with refusals. Defaults to 100 ms.
	RetryAfter time.Duration
	// ClockOffset sets the gateway's clock off the system's: its TLS judges
	// node certificates by it and Challenge's server_time carries it, as a
	// gateway whose clock is wrong does.
	ClockOffset time.Duration
	// RetiredNodeCAs are node CA roots that Reattest's key proofs may
	// chain to but handshakes do not trust, as a gateway keeps the roots a
	// node-CA rotation retired. Defaults to none.
	RetiredNodeCAs []*x509.Certificate
	// ReconnectWindow, when set, is sent in Welcome as reconnect_window.
	ReconnectWindow time.Duration
}

// Gateway is a fake gateway serving JoinService and SessionService on
// 127.0.0.1. Its methods are safe for concurrent use.
type Gateway struct {
	// URL is "https://127.0.0.1:<port>".
	URL string
	// PKI is the PKI the gateway serves from.
	PKI *PKI

	opts     GatewayOptions
	srv      *grpc.Server
	sessions chan *Session

	mu          sync.Mutex
	tokens      map[string]bool
	revoked     map[string]string // node id -> reason
	refuse      []refusal
	joinGWs     []string
	welcomeGWs  []string
	welcomeSID  string
	groups      map[string]tls.CurveID // RPC name -> key exchange of its last call
	open        int
	lastSession int

	nonces map[string]string // Challenge nonce -> exporter of its connection

	joins, renewals, reattests, nodeSeq atomic.Int64

	sessionv1.UnimplementedJoinServiceServer
	sessionv1.UnimplementedSessionServiceServer
}

// NewGateway starts a Gateway for p; t's cleanup stops it.
func NewGateway(t testing.TB, p *PKI, opts GatewayOptions) *Gateway {
	t.Helper()
	if opts.ID == "" {
		opts.ID = "gw-test"
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 50 * time.Millisecond
	}
	if opts.CertTTL == 0 {
		opts.CertTTL = time.Hour
	}
	if opts.RetryAfter == 0 {
		opts.RetryAfter = 100 * time.Millisecond
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	cert := p.ServerCertificate(t)
	creds := credentials.NewTLS(&tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    p.NodeCAPool(),
		Time:         func() time.Time { return time.Now().Add(opts.ClockOffset) },
	})
	g := &Gateway{
		URL:      "https://" + lis.Addr().String(),
		PKI:      p,
		opts:     opts,
		srv:      grpc.NewServer(grpc.Creds(creds)),
		sessions: make(chan *Session, 128),
		tokens:   map[string]bool{},
		revoked:  map[string]string{},
		groups:   map[string]tls.CurveID{},
	}
	for _, tok := range opts.Tokens {
		g.AddToken(tok)
	}
	sessionv1.RegisterJoinServiceServer(g.srv, g)
	sessionv1.RegisterSessionServiceServer(g.srv, g)
	go func() { _ = g.srv.Serve(lis) }()
	t.Cleanup(g.Close)
	return g
}

// Close stops the gateway at once, ending every session.
func (g *Gateway) Close() { g.srv.Stop() }

// AddToken makes Join accept tok.
func (g *Gateway) AddToken(tok string) {
	g.mu.Lock()
	g.tokens[strings.TrimSpace(tok)] = true
	g.mu.Unlock()
}

// SetJoinGateways sets the gateway list Join returns (default: this
// gateway's URL).
func (g *Gateway) SetJoinGateways(urls ...string) {
	g.mu.Lock()
	g.joinGWs = urls
	g.mu.Unlock()
}

// SetWelcomeGateways sets the gateway list Welcome carries (default:
// none).
func (g *Gateway) SetWelcomeGateways(urls ...string) {
	g.mu.Lock()
	g.welcomeGWs = urls
	g.mu.Unlock()
}

// SetWelcomeSessionID makes Welcome carry id as its session id instead of
// the gateway's own "<ID>-s<n>" (a hostile gateway's; "" restores the
// default).
func (g *Gateway) SetWelcomeSessionID(id string) {
	g.mu.Lock()
	g.welcomeSID = id
	g.mu.Unlock()
}

// Revoke makes Connect refuse nodeID with PERMISSION_DENIED and Renew with
// UNAUTHENTICATED.
func (g *Gateway) Revoke(nodeID, reason string) {
	g.mu.Lock()
	g.revoked[nodeID] = reason
	g.mu.Unlock()
}

// RefuseNext makes the next Connect end with code and, when retryAfter is
// not 0, the retry hint retryAfter in the trailer.
func (g *Gateway) RefuseNext(code codes.Code, retryAfter time.Duration) {
	g.mu.Lock()
	g.refuse = append(g.refuse, refusal{code: code, hint: retryAfter})
	g.mu.Unlock()
}

// refusal is a Connect refused on purpose.
type refusal struct {
	code codes.Code
	hint time.Duration
}

// Sessions delivers each session once its Welcome is sent.
func (g *Gateway) Sessions() <-chan *Session { return g.sessions }

// NextSession waits for the next session or fails t after timeout.
func (g *Gateway) NextSession(t testing.TB, timeout time.Duration) *Session {
	t.Helper()
	select {
	case s := <-g.sessions:
		return s
	case <-time.After(timeout):
		t.Fatalf("no session on %s within %v", g.URL, timeout)
		return nil
	}
}

// Joins counts successful Join calls.
func (g *Gateway) Joins() int64 { return g.joins.Load() }

// Renewals counts successful Renew calls.
func (g *Gateway) Renewals() int64 { return g.renewals.Load() }

// OpenSessions counts sessions whose stream is open.
func (g *Gateway) OpenSessions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// KeyExchange returns the TLS key exchange group of the last call of rpc
// ("Join", "Renew" or "Connect"); 0 before the first.
func (g *Gateway) KeyExchange(rpc string) tls.CurveID {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.groups[rpc]
}

// noteKeyExchange records the key exchange of the connection of rpc's call.
func (g *Gateway) noteKeyExchange(ctx context.Context, rpc string) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
		g.mu.Lock()
		g.groups[rpc] = ti.State.CurveID
		g.mu.Unlock()
	}
}

// Join implements JoinService.Join.
func (g *Gateway) Join(ctx context.Context, req *sessionv1.JoinRequest) (*sessionv1.JoinResponse, error) {
	g.noteKeyExchange(ctx, "Join")
	if _, err := jointoken.Parse(req.GetToken()); err != nil {
		return nil, status.Error(codes.Unauthenticated, "malformed join token")
	}
	g.mu.Lock()
	ok := g.tokens[req.GetToken()]
	gws := g.joinGWs
	g.mu.Unlock()
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "unknown join token")
	}
	id := fmt.Sprintf("node-%d", g.nodeSeq.Add(1))
	resp, err := g.issue(req.GetCsr(), id)
	if err != nil {
		return nil, err
	}
	g.joins.Add(1)
	if len(gws) == 0 {
		gws = []string{g.URL}
	}
	return &sessionv1.JoinResponse{
		NodeId:           id,
		CertificateChain: resp.CertificateChain,
		NodeCaRoots:      resp.NodeCaRoots,
		TrustDomain:      g.PKI.TrustDomain,
		SpiffeId:         g.PKI.SPIFFEID(id).String(),
		Gateways:         gws,
		RenewAfter:       resp.RenewAfter,
		ServerTime:       resp.ServerTime,
		PoolId:           "pool-test",
		SiteId:           "site-test",
		Region:           "test",
	}, nil
}

// Renew implements JoinService.Renew.
func (g *Gateway) Renew(ctx context.Context, req *sessionv1.RenewRequest) (*sessionv1.RenewResponse, error) {
	g.noteKeyExchange(ctx, "Renew")
	id, _, err := g.peer(ctx)
	if err != nil {
		return nil, err
	}
	if g.isRevoked(id) != "" {
		// As the real gateway answers (controlplane/gateway, refusal).
		st, err := status.New(codes.PermissionDenied, "node revoked").WithDetails(&errdetails.ErrorInfo{
			Reason: sessionv1.IdentityRefusal_REVOKED.String(), Domain: sessionv1.RefusalDomain})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	resp, err := g.issue(req.GetCsr(), id)
	if err != nil {
		return nil, err
	}
	g.renewals.Add(1)
	return resp, nil
}

func (g *Gateway) issue(csr []byte, id string) (*sessionv1.RenewResponse, error) {
	// Backdated an hour and renewed at two thirds of the time from issue,
	// as the control plane does (controlplane/pkg/pki).
	now := time.Now()
	nb, na := now.Add(-time.Hour), now.Add(g.opts.CertTTL)
	cert, err := g.PKI.IssueNode(csr, id, nb, na)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ra := now.Add(na.Sub(now) * 2 / 3)
	if g.opts.RenewAfter != 0 {
		ra = now.Add(g.opts.RenewAfter)
	}
	return &sessionv1.RenewResponse{
		CertificateChain: [][]byte{cert.Raw},
		NodeCaRoots:      [][]byte{g.PKI.NodeCA.Raw},
		RenewAfter:       timestamppb.New(ra),
		ServerTime:       timestamppb.New(now),
	}, nil
}

// Challenge implements JoinService.Challenge: a random nonce, remembered
// for this connection's exporter.
func (g *Gateway) Challenge(ctx context.Context, _ *sessionv1.ChallengeRequest) (*sessionv1.ChallengeResponse, error) {
	ekm, err := exporterOf(ctx)
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	g.mu.Lock()
	if g.nonces == nil {
		g.nonces = map[string]string{}
	}
	g.nonces[string(nonce)] = string(ekm)
	g.mu.Unlock()
	return &sessionv1.ChallengeResponse{Nonce: nonce, ServerTime: timestamppb.New(time.Now().Add(g.opts.ClockOffset)), ValidFor: durationpb.New(time.Minute)}, nil
}

// Reattest implements JoinService.Reattest: it checks the key proof as
// the control plane does (a nonce of this connection, a chain from the node
// CA or one of GatewayOptions.RetiredNodeCAs, the leaf's key) and issues a
// certificate, or refuses with GRACE_PASSED when
// GatewayOptions.ReattestRefused is set.
func (g *Gateway) Reattest(ctx context.Context, req *sessionv1.ReattestRequest) (*sessionv1.RenewResponse, error) {
	ekm, err := exporterOf(ctx)
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	p := req.GetProof()
	g.mu.Lock()
	want, ok := g.nonces[string(p.GetNonce())]
	delete(g.nonces, string(p.GetNonce()))
	g.mu.Unlock()
	if !ok || want != string(ekm) || len(p.GetCertificateChain()) == 0 {
		return nil, status.Error(codes.Unauthenticated, "nonce not of this connection")
	}
	leaf, err := x509.ParseCertificate(p.GetCertificateChain()[0])
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	roots := g.PKI.NodeCAPool()
	for _, r := range g.opts.RetiredNodeCAs {
		roots.AddCert(r)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: leaf.NotAfter.Add(-time.Second),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if err := keyproof.Verify(leaf.PublicKey, keyproof.PurposeReattest, p.GetNonce(), ekm, p.GetSignature()); err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if g.opts.ReattestRefused {
		st, err := status.New(codes.FailedPrecondition, "certificate expired longer ago than the grace").WithDetails(&errdetails.ErrorInfo{
			Reason: sessionv1.IdentityRefusal_GRACE_PASSED.String(), Domain: sessionv1.RefusalDomain})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	resp, err := g.issue(req.GetCsr(), leaf.Subject.CommonName)
	if err != nil {
		return nil, err
	}
	g.reattests.Add(1)
	return resp, nil
}

// Reattests returns how many Reattest calls succeeded.
func (g *Gateway) Reattests() int64 { return g.reattests.Load() }

func exporterOf(ctx context.Context) ([]byte, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return nil, keyproof.ErrNoExporter
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, keyproof.ErrNoExporter
	}
	return keyproof.Exporter(&info.State)
}

// peer returns the node id and certificate of the mTLS peer.
func (g *Gateway) peer(ctx context.Context) (string, *x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", nil, status.Error(codes.Unauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.PeerCertificates) == 0 {
		return "", nil, status.Error(codes.Unauthenticated, "no client certificate")
	}
	leaf := ti.State.PeerCertificates[0]
	prefix := "spiffe://" + g.PKI.TrustDomain + "/node/"
	for _, u := range leaf.URIs {
		if id, ok := strings.CutPrefix(u.String(), prefix); ok && id != "" {
			return id, leaf, nil
		}
	}
	return "", nil, status.Error(codes.Unauthenticated, "no node SPIFFE id")
}

func (g *Gateway) isRevoked(id string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.revoked[id]
}

// Connect implements SessionService.Connect.
func (g *Gateway) Connect(stream sessionv1.SessionService_ConnectServer) error {
	g.noteKeyExchange(stream.Context(), "Connect")
	id, leaf, err := g.peer(stream.Context())
	if err != nil {
		return err
	}
	if r := g.isRevoked(id); r != "" {
		return status.Error(codes.PermissionDenied, r)
	}
	g.mu.Lock()
	var refuse *refusal
	if len(g.refuse) > 0 {
		refuse, g.refuse = &g.refuse[0], g.refuse[1:]
	} else if g.opts.MaxSessions > 0 && g.open >= g.opts.MaxSessions {
		refuse = &refusal{code: codes.ResourceExhausted, hint: g.opts.RetryAfter}
	}
	g.mu.Unlock()
	if refuse != nil {
		if refuse.hint > 0 {
			stream.SetTrailer(metadata.Pairs("retry-after-ms", strconv.FormatInt(refuse.hint.Milliseconds(), 10)))
		}
		return status.Error(refuse.code, "refused by the test gateway")
	}

	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "first message is not Hello")
	}
	g.mu.Lock()
	g.open++
	g.lastSession++
	sid := cmp.Or(g.welcomeSID, fmt.Sprintf("%s-s%d", g.opts.ID, g.lastSession))
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.open--
		g.mu.Unlock()
	}()

	s := &Session{
		ID:         sid,
		NodeID:     id,
		Hello:      hello,
		Cert:       leaf,
		Gateway:    g,
		stream:     stream,
		messages:   make(chan *sessionv1.NodeMessage, 256),
		heartbeats: make(chan *sessionv1.Heartbeat, 256),
		end:        make(chan *status.Status, 1),
		done:       make(chan struct{}),
	}
	defer close(s.done)
	g.mu.Lock()
	welcomeGWs := g.welcomeGWs
	g.mu.Unlock()
	err = s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Welcome{Welcome: &sessionv1.Welcome{
		SessionId:         sid,
		HeartbeatInterval: durationpb.New(g.opts.HeartbeatInterval),
		ServerTime:        timestamppb.Now(),
		Capabilities:      hello.GetCapabilities(),
		NodeId:            id,
		GatewayId:         g.opts.ID,
		Gateways:          welcomeGWs,
		ReconnectWindow:   window(g.opts.ReconnectWindow),
	}}})
	if err != nil {
		return err
	}
	select {
	case g.sessions <- s:
	default: // nobody is watching
	}

	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if hb := m.GetHeartbeat(); hb != nil {
				select {
				case s.heartbeats <- hb:
				default:
				}
			}
			select {
			case s.messages <- m:
			default:
			}
		}
	}()
	select {
	case st := <-s.end:
		return st.Err()
	case err := <-recvErr:
		return err
	}
}

// Session is one Connect stream the Gateway holds.
type Session struct {
	// ID is Welcome.session_id.
	ID string
	// NodeID is the node named by the client certificate.
	NodeID string
	// Hello is the node's Hello.
	Hello *sessionv1.Hello
	// Cert is the client certificate the node presented.
	Cert *x509.Certificate
	// Gateway is the gateway holding the session.
	Gateway *Gateway

	mu         sync.Mutex
	stream     sessionv1.SessionService_ConnectServer
	seq        uint64
	messages   chan *sessionv1.NodeMessage
	heartbeats chan *sessionv1.Heartbeat
	end        chan *status.Status
	done       chan struct{}
}

// Send sends msg to the node, numbering it.
func (s *Session) Send(msg *sessionv1.GatewayMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	msg.Seq = s.seq
	return s.stream.Send(msg)
}

// SendDrain sends Drain with delay and preferred gateways.
func (s *Session) SendDrain(delay time.Duration, prefer ...string) error {
	return s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Drain{Drain: &sessionv1.Drain{
		Delay: durationpb.New(delay), Reason: "test drain", PreferGateways: prefer,
	}}})
}

// SendRevoked sends Revoked with reason.
func (s *Session) SendRevoked(reason string) error {
	return s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Revoked{Revoked: &sessionv1.Revoked{Reason: reason}}})
}

// End ends the stream with st (status.New(codes.OK, "") for a clean end).
func (s *Session) End(st *status.Status) {
	select {
	case s.end <- st:
	default:
	}
}

// Done is closed when the stream has ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// Messages delivers every message the node sent after Hello (up to a
// buffer of 256; later ones are dropped when nobody reads).
func (s *Session) Messages() <-chan *sessionv1.NodeMessage { return s.messages }

// Heartbeats delivers the node's heartbeats (buffered like Messages).
func (s *Session) Heartbeats() <-chan *sessionv1.Heartbeat { return s.heartbeats }

// NextHeartbeat waits for the next heartbeat or fails t after timeout.
func (s *Session) NextHeartbeat(t testing.TB, timeout time.Duration) *sessionv1.Heartbeat {
	t.Helper()
	select {
	case hb := <-s.heartbeats:
		return hb
	case <-time.After(timeout):
		t.Fatalf("no heartbeat in session %s within %v", s.ID, timeout)
		return nil
	}
}

// window is Welcome.reconnect_window for d: unset when zero.
func window(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}
