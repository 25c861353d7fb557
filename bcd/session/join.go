package session

import (
	"cmp"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/proto/jointoken"
	"github.com/better-compute/better-compute/proto/keyproof"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// DefaultJoinTimeout bounds a Join call when JoinParams.Timeout is zero.
const DefaultJoinTimeout = 30 * time.Second

// JoinParams are the inputs of Join.
type JoinParams struct {
	// GatewayURL is the gateway to join through, "https://host[:port]".
	// Required.
	GatewayURL string
	// Token is the join token, "bct1.<id>.<secret>.<pin>"; surrounding
	// white space is ignored. Required. It is sent to the gateway and
	// nowhere else: never logged, never in an error.
	Token string
	// Key is the node's new private key (ECDSA P-256); the CSR is made for
	// it. Required.
	Key crypto.Signer
	// Facts describe the node. Defaults to none.
	Facts *sessionv1.NodeFacts
	// Trust overrides how the gateway is authenticated (an explicit CA
	// file or pin). Defaults to the pin the token carries.
	Trust Trust
	// Timeout bounds the whole call. Defaults to DefaultJoinTimeout.
	Timeout time.Duration
	// UserAgent is sent as the gRPC user agent. Defaults to "bcd".
	UserAgent string
	// Now is this machine's clock. Defaults to time.Now. The gateway's
	// certificate is verified by it; the issued certificate is judged by
	// the gateway's time (JoinResponse.server_time) when the two disagree
	// by more than a minute.
	Now func() time.Time
	// Logger receives the warning about a clock that disagrees with the
	// gateway's. Defaults to discarding it.
	Logger *slog.Logger
	// ProveChain is set when the machine still has a node's identity: that
	// node's certificate chain, whose key is Key. The join then proves the
	// key over a challenge of its connection (JoinRequest.proof) and takes
	// the node's id without revoking its certificate. Defaults to none: a
	// new node, whatever the hostname.
	ProveChain []*x509.Certificate
}

// JoinResult is the identity Join obtained: everything a node must keep to
// run a Client.
type JoinResult struct {
	// NodeID is the id the control plane gave the node.
	NodeID string
	// TrustDomain is the SPIFFE trust domain, for example
	// "compute.example.com".
	TrustDomain string
	// SPIFFEID is "spiffe://<TrustDomain>/node/<NodeID>".
	SPIFFEID string
	// Chain is the node's certificate chain, leaf first, without the root.
	Chain []*x509.Certificate
	// NodeCARoots are the node CA roots.
	NodeCARoots []*x509.Certificate
	// Gateways are the region's gateway URLs; the gateway joined through
	// when the response named none.
	Gateways []string
	// RenewAfter is when to renew Chain.
	RenewAfter time.Time
	// Trust is how the gateway was authenticated, to be used for every
	// later connection.
	Trust Trust
	// PoolID, SiteID and Region place the node.
	PoolID, SiteID, Region string
	// PoolName and SiteName name that pool and site, for people.
	PoolName, SiteName string
	// Rejoined reports that the join took an existing node's id (by the
	// key proof, or a token made by nodes reinstall).
	Rejoined bool
	// Repeated reports that the gateway recognised a repeated join (same
	// token and key) and used no further token use.
	Repeated bool
	// Warnings are the gateway's, for the person running the join (another
	// node has this hostname).
	Warnings []string
	// ReattestGrace is how long after expiry the gateways re-attest the
	// certificate; zero when the gateway did not say.
	ReattestGrace time.Duration
	// ClockSkew is this machine's clock minus the gateway's, as measured
	// from the answer (negative: behind); 0 when the gateway sent no time.
	ClockSkew time.Duration
}

// Join exchanges a join token and a CSR for p.Key for the node's identity
// (JoinService.Join, server-authenticated TLS 1.3). The gateway is trusted
// through p.Trust or else the token's pin, never on first use.
//
// It fails with an error wrapping ErrConfig for bad parameters (a malformed
// token wraps jointoken.ErrMalformed too), ErrUntrustedGateway when the
// gateway's certificate does not match the trust, ErrJoinRefused when the
// gateway refuses the token or the request, and ErrProtocol when the
// answer is unusable. Other errors are transport failures worth retrying.
// A RESOURCE_EXHAUSTED refusal (too many Joins from this address) is
// retried after the gateway's retry hint, with backoff, within p.Timeout;
// past it that refusal is returned, saying how long to wait.
func Join(ctx context.Context, p JoinParams) (*JoinResult, error) {
	res, err := join(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	return res, nil
}

func join(ctx context.Context, p JoinParams) (*JoinResult, error) {
	gw, err := parseGatewayURL(p.GatewayURL)
	if err != nil {
		return nil, err
	}
	tok, err := jointoken.Parse(p.Token)
	if err != nil {
		return nil, fmt.Errorf("%w: token: %w", ErrConfig, err)
	}
	if p.Key == nil {
		return nil, fmt.Errorf("%w: no key", ErrConfig)
	}
	trust := p.Trust
	if trust.IsZero() {
		pins := tok.Pins()
		trust = Trust{Pin: pins[0], ExtraPins: pins[1:]}
	}
	if err := trust.validate(); err != nil {
		return nil, err
	}
	now := p.Now
	if now == nil {
		now = time.Now
	}
	csr, err := newCSR(p.Key)
	if err != nil {
		return nil, err
	}

	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clk := newGatewayClock(now, nil, log)

	var vf verifyFailure
	cfg := trust.tlsConfig(gw.host, clk, nil, vf.set)
	// Join offers X25519 alone, not Go's default hybrid X25519MLKEM768:
	// what a later quantum computer could read from a recording of this
	// exchange is a join token long expired, a certificate and a CA bundle,
	// which are public, and the node's facts and placement (metadata).
	// Sessions, Renew and Secret keep the hybrid (docs/pki.md, "Key
	// exchange").
	cfg.CurvePreferences = []tls.CurveID{tls.X25519}
	cc, err := dial(gw, cfg, transport{
		writeBuffer: DefaultBufferSize,
		userAgent:   cmp.Or(p.UserAgent, "bcd"),
	})
	if err != nil {
		return nil, err
	}
	defer cc.Close()

	ctx, cancel := context.WithTimeout(ctx, cmp.Or(p.Timeout, DefaultJoinTimeout))
	defer cancel()
	req := &sessionv1.JoinRequest{Token: tok.String(), Csr: csr, Facts: p.Facts}
	if len(p.ProveChain) > 0 {
		if req.Proof, _, err = prove(ctx, cc, keyproof.PurposeRejoin, p.Key, p.ProveChain); err != nil {
			if verr := vf.get(); verr != nil {
				return nil, fmt.Errorf("gateway %s: %w", gw.url, verr)
			}
			return nil, fmt.Errorf("gateway %s: %w", gw.url, err)
		}
	}
	resp, err := joinRetrying(ctx, sessionv1.NewJoinServiceClient(cc), req, gw.url, log)
	if err != nil {
		if verr := vf.get(); verr != nil {
			return nil, fmt.Errorf("gateway %s: %w", gw.url, verr)
		}
		switch refusalOf(err) {
		case sessionv1.IdentityRefusal_PROOF_INVALID, sessionv1.IdentityRefusal_UNKNOWN_NODE,
			sessionv1.IdentityRefusal_NOT_LATEST_KEY, sessionv1.IdentityRefusal_REVOKED:
			return nil, fmt.Errorf("%w: %w by gateway %s: %s", ErrProofRefused, ErrJoinRefused, gw.url, status.Convert(err).Message())
		}
		switch status.Code(err) {
		case codes.Unauthenticated, codes.InvalidArgument, codes.PermissionDenied, codes.FailedPrecondition:
			return nil, fmt.Errorf("%w by gateway %s: %s", ErrJoinRefused, gw.url, status.Convert(err).Message())
		}
		return nil, fmt.Errorf("gateway %s: %w", gw.url, err)
	}
	// A wrong clock must not refuse the certificate a token was spent on:
	// it is judged by the gateway's time when the clocks disagree.
	judge, skew := clk.observe(ctx, gw.url, resp.GetServerTime())
	res, err := joinResult(resp, p.Key, trust, gw.url, judge)
	if err != nil {
		return nil, err
	}
	res.ClockSkew = skew
	return res, nil
}

// Join's retries of RESOURCE_EXHAUSTED (the gateway's Join rate per
// source address, issue 28): full-jitter backoff from joinBackoffBase to
// joinBackoffMax, never shorter than the gateway's hint.
const (
	joinBackoffBase = 500 * time.Millisecond
	joinBackoffMax  = 30 * time.Second
)

// joinRetrying calls Join, and calls it again after a RESOURCE_EXHAUSTED
// refusal (the gateway's Join rate for this address: many nodes behind one
// NAT address joining at once) once the gateway's retry hint and a backoff
// have passed, until ctx ends. When the wait would outlast ctx it returns
// the refusal, which says how long to wait.
func joinRetrying(ctx context.Context, c sessionv1.JoinServiceClient, req *sessionv1.JoinRequest, gwURL string, log *slog.Logger) (*sessionv1.JoinResponse, error) {
	for attempt := 0; ; attempt++ {
		var trailer metadata.MD
		resp, err := c.Join(ctx, req, grpc.Trailer(&trailer))
		if status.Code(err) != codes.ResourceExhausted {
			return resp, err
		}
		hint := retryHint(trailer)
		for _, d := range status.Convert(err).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
				hint = max(hint, min(ri.GetRetryDelay().AsDuration(), MaxRetryHint))
			}
		}
		wait := reconnectDelay(randomJitter, joinBackoffBase, joinBackoffMax, attempt, hint)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return nil, err
		}
		log.InfoContext(ctx, "Join refused for now, retrying", attrGateway, gwURL, attrDelay, wait, attrAttempt, attempt,
			"reason", status.Convert(err).Message())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// joinResult checks a JoinResponse and turns it into a JoinResult.
func joinResult(resp *sessionv1.JoinResponse, key crypto.Signer, trust Trust, joinedVia string, now time.Time) (*JoinResult, error) {
	if resp.GetNodeId() == "" {
		return nil, fmt.Errorf("%w: no node id", ErrProtocol)
	}
	chain, err := parseDERs("certificate", resp.GetCertificateChain())
	if err != nil {
		return nil, err
	}
	roots, err := parseDERs("node CA root", resp.GetNodeCaRoots())
	if err != nil {
		return nil, err
	}
	if err := checkIssued(chain, roots, key, now); err != nil {
		return nil, err
	}
	spiffe := resp.GetSpiffeId()
	if spiffe != "" && !slices.ContainsFunc(chain[0].URIs, func(u *url.URL) bool { return u.String() == spiffe }) {
		return nil, fmt.Errorf("%w: certificate does not name %s", ErrProtocol, spiffe)
	}
	gws := resp.GetGateways()
	if err := checkGatewayList("join gateways", gws); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	for _, g := range gws {
		if _, err := parseGatewayURL(g); err != nil {
			return nil, fmt.Errorf("%w: gateway list: %q is not an https://host[:port] URL", ErrProtocol, g)
		}
	}
	if len(gws) == 0 || IsWebSocketURL(joinedVia) {
		// Joined through the WebSocket fallback: the gateways' direct
		// addresses are what this site cannot reach, and the fallback is
		// left only by configuration.
		gws = []string{joinedVia}
	}
	renewAfter := defaultRenewAfter(chain[0])
	if ra := resp.GetRenewAfter(); ra != nil && ra.IsValid() {
		renewAfter = ra.AsTime()
	}
	return &JoinResult{
		NodeID:        resp.GetNodeId(),
		TrustDomain:   resp.GetTrustDomain(),
		SPIFFEID:      spiffe,
		Chain:         chain,
		NodeCARoots:   roots,
		Gateways:      slices.Clone(gws),
		RenewAfter:    renewAfter,
		Trust:         trust,
		PoolID:        resp.GetPoolId(),
		PoolName:      resp.GetPoolName(),
		SiteName:      resp.GetSiteName(),
		SiteID:        resp.GetSiteId(),
		Region:        resp.GetRegion(),
		Rejoined:      resp.GetRejoined(),
		Repeated:      resp.GetRepeated(),
		Warnings:      slices.Clone(resp.GetWarnings()),
		ReattestGrace: resp.GetReattestGrace().AsDuration(),
	}, nil
}
