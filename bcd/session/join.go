package session

import (
	"cmp"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/proto/jointoken"
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
	// Now is the clock used to verify certificates. Defaults to time.Now.
	Now func() time.Time
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
		trust = Trust{Pin: tok.Pin()}
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

	var vf verifyFailure
	cfg := trust.tlsConfig(gw.host, now, nil, vf.set)
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
	resp, err := sessionv1.NewJoinServiceClient(cc).Join(ctx, &sessionv1.JoinRequest{
		Token: tok.String(),
		Csr:   csr,
		Facts: p.Facts,
	})
	if err != nil {
		if verr := vf.get(); verr != nil {
			return nil, fmt.Errorf("gateway %s: %w", gw.url, verr)
		}
		switch status.Code(err) {
		case codes.Unauthenticated, codes.InvalidArgument, codes.PermissionDenied, codes.FailedPrecondition:
			return nil, fmt.Errorf("%w by gateway %s: %s", ErrJoinRefused, gw.url, status.Convert(err).Message())
		}
		return nil, fmt.Errorf("gateway %s: %w", gw.url, err)
	}
	return joinResult(resp, p.Key, trust, gw.url, now())
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
	for _, g := range gws {
		if _, err := parseGatewayURL(g); err != nil {
			return nil, fmt.Errorf("%w: gateway list: %q is not an https://host[:port] URL", ErrProtocol, g)
		}
	}
	if len(gws) == 0 {
		gws = []string{joinedVia}
	}
	renewAfter := defaultRenewAfter(chain[0])
	if ra := resp.GetRenewAfter(); ra != nil && ra.IsValid() {
		renewAfter = ra.AsTime()
	}
	return &JoinResult{
		NodeID:      resp.GetNodeId(),
		TrustDomain: resp.GetTrustDomain(),
		SPIFFEID:    spiffe,
		Chain:       chain,
		NodeCARoots: roots,
		Gateways:    slices.Clone(gws),
		RenewAfter:  renewAfter,
		Trust:       trust,
		PoolID:      resp.GetPoolId(),
		SiteID:      resp.GetSiteId(),
		Region:      resp.GetRegion(),
	}, nil
}
