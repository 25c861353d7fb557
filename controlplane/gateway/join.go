package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/keyproof"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// MaxSecretNameLen is the longest secret name JoinService.Secret accepts.
const MaxSecretNameLen = 256

// joinService implements JoinService.
type joinService struct {
	sessionv1.UnimplementedJoinServiceServer
	g *Gateway
}

// Join admits a machine with its join token (package admission).
func (j *joinService) Join(ctx context.Context, req *sessionv1.JoinRequest) (*sessionv1.JoinResponse, error) {
	g := j.g
	source := peerIP(ctx)
	if ok, wait := g.joins.allow(source, g.cfg.Clock.Now()); !ok {
		return nil, g.joinRateLimited(ctx, source, wait)
	}
	f := req.GetFacts()
	var proven *admission.ProvenKey
	if p := req.GetProof(); p != nil {
		var err error
		if proven, err = g.checkProof(ctx, p, keyproof.PurposeRejoin); err != nil {
			return nil, err
		}
	}
	adm, err := g.admit.Join(ctx, &admission.Request{
		Token: req.GetToken(),
		CSR:   req.GetCsr(),
		Facts: admission.Facts{
			Hostname: f.GetHostname(), MachineID: f.GetMachineId(), OS: f.GetOs(), Arch: f.GetArch(),
			BCDVersion: f.GetBcdVersion(), BootID: f.GetBootId(), Labels: f.GetLabels(),
		},
		Source: source,
		Via:    "gateway:" + g.cfg.ID,
		Proven: proven,
	})
	switch {
	case errors.Is(err, admission.ErrUnknownNode) || errors.Is(err, admission.ErrNotLatestKey) || errors.Is(err, admission.ErrNodeRevoked):
		return nil, g.admissionStatus(ctx, "join", err)
	case err != nil:
		return nil, joinStatus(err)
	}
	return &sessionv1.JoinResponse{
		NodeId:           adm.Node.ID,
		CertificateChain: [][]byte{adm.Cert.CertDER},
		NodeCaRoots:      g.rootsDER(),
		TrustDomain:      g.current().bundle.TrustDomain,
		SpiffeId:         adm.Cert.SPIFFEID,
		Gateways:         g.regionGateways(ctx, adm.Site.Region),
		RenewAfter:       timestamppb.New(adm.Cert.RenewAfter),
		PoolId:           adm.Pool.ID,
		PoolName:         adm.Pool.Name,
		SiteId:           adm.Site.ID,
		SiteName:         adm.Site.Name,
		Region:           adm.Site.Region,
		ServerTime:       timestamppb.New(g.cfg.Clock.Now()),
		Warnings:         adm.Warnings,
		Rejoined:         adm.Rejoined,
		Repeated:         adm.Repeated,
		ReattestGrace:    durationpb.New(g.cfg.ReattestGrace),
	}, nil
}

// joinRateLimited refuses a Join over its source's rate (Config.JoinRate)
// with RESOURCE_EXHAUSTED, a "retry-after-ms" trailer and a RetryInfo
// detail, as a full gateway refuses a Connect; the refusal is audited in
// the summary of its source (admission.RefuseRateLimited).
func (g *Gateway) joinRateLimited(ctx context.Context, source string, wait time.Duration) error {
	g.cfg.Metrics.Refused(g.cfg.ID, reasonJoinRate)
	// Spread the retries of a burst over a quarter more.
	wait += rand.N(wait/4 + 1)
	g.admit.RefuseRateLimited(ctx, source, "gateway:"+g.cfg.ID, wait)
	_ = grpc.SetTrailer(ctx, metadata.Pairs(TrailerRetryAfter, strconv.FormatInt(max(wait.Milliseconds(), 1), 10)))
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("too many join attempts from %s (at most %g a second): retry in %s",
		source, g.cfg.JoinRate, wait.Round(time.Millisecond)))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// joinStatus turns an admission error into the status a daemon sees: a clear
// reason for a refusal, nothing of the system's errors.
func joinStatus(err error) error {
	var msg string
	switch {
	case errors.Is(err, admission.ErrTokenMalformed):
		msg = "join token malformed: pass the whole token as join-tokens create printed it"
	case errors.Is(err, store.ErrTokenInvalid):
		msg = "join token unknown"
	case errors.Is(err, store.ErrTokenExpired):
		msg = "join token expired: create a new one with better-compute join-tokens create"
	case errors.Is(err, store.ErrTokenRevoked):
		msg = "join token revoked"
	case errors.Is(err, store.ErrTokenExhausted):
		msg = "join token used up: it reached its max uses"
	case errors.Is(err, admission.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	default:
		return status.Error(codes.Internal, "join failed on the gateway; see its log")
	}
	return status.Error(codes.Unauthenticated, msg)
}

// rootsDER returns the node CA roots in force, DER-encoded.
func (g *Gateway) rootsDER() [][]byte {
	return g.current().rootsDER
}

// regionGateways lists the public URLs of the live gateways of region, this
// one first when it serves the region. With none listed (a region without a
// gateway of its own yet), it lists this one, so the node can connect.
func (g *Gateway) regionGateways(ctx context.Context, region string) []string {
	var urls []string
	if region == g.cfg.Region {
		urls = append(urls, g.publicURL)
	}
	gws, err := g.gateways.list(ctx, g.store, g.cfg.Clock.Now())
	if err != nil {
		g.log.WarnContext(ctx, "Gateway list unavailable; answering from the last one read", logkey.Err, err, "gateways", len(gws))
	}
	live := g.cfg.Clock.Now().Add(-2 * g.cfg.LeaseTTL)
	for _, gw := range gws {
		if gw.Region != region || gw.Draining || gw.HeartbeatAt.Before(live) || gw.Address == "" || slices.Contains(urls, gw.Address) {
			continue
		}
		urls = append(urls, gw.Address)
	}
	if len(urls) == 0 {
		urls = append(urls, g.publicURL)
	}
	return urls
}

// gatewayListMaxAge is how long a Join answers from the gateway list it
// last read: a gateway that starts or drains is in, or out of, the answers
// within a second.
const gatewayListMaxAge = time.Second

// gatewayCache is the gateways table as last read. Every Join answers with
// its region's gateways; reading the table for each was 7% of a join's CPU
// at 500 joins/s.
type gatewayCache struct {
	mu   sync.Mutex
	read time.Time // by the gateway's clock; zero: never read
	gws  []*store.Gateway
}

// forget makes the next list read the table: for the Drain of a shutdown,
// which must name a gateway that started within the last second.
func (c *gatewayCache) forget() {
	c.mu.Lock()
	c.read = time.Time{}
	c.mu.Unlock()
}

// list returns the gateways, read from st when the last read is older than
// gatewayListMaxAge at now. Joins that find the list old wait for one read
// rather than each making its own. When the read fails, it returns the
// last list read (nil if none) with the error.
func (c *gatewayCache) list(ctx context.Context, st Store, now time.Time) ([]*store.Gateway, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if age := now.Sub(c.read); !c.read.IsZero() && age >= 0 && age < gatewayListMaxAge {
		return c.gws, nil
	}
	gws, err := st.GatewayList(ctx)
	if err != nil {
		return c.gws, err
	}
	c.gws, c.read = gws, now
	return gws, nil
}

// Renew issues a new certificate for the calling node.
func (j *joinService) Renew(ctx context.Context, req *sessionv1.RenewRequest) (*sessionv1.RenewResponse, error) {
	g := j.g
	id, err := g.authenticate(ctx, codes.Unauthenticated)
	if err != nil {
		return nil, err
	}
	cert, err := g.admit.Renew(ctx, &admission.RenewRequest{
		NodeID: id.nodeID, CSR: req.GetCsr(), Serial: id.serial, Source: peerIP(ctx), Via: "gateway:" + g.cfg.ID,
	})
	switch {
	case errors.Is(err, admission.ErrInvalidRequest):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, g.internal(ctx, "renew", err)
	}
	// The session this node holds here now answers to the new serial: a
	// later revocation of the old one does not end it.
	g.sessions.renewed(id.nodeID, cert.Serial)
	return g.renewResponse(cert), nil
}

// renewResponse is the answer carrying a renewed or re-attested
// certificate.
func (g *Gateway) renewResponse(cert *pki.Issued) *sessionv1.RenewResponse {
	return &sessionv1.RenewResponse{
		CertificateChain: [][]byte{cert.CertDER},
		NodeCaRoots:      g.rootsDER(),
		RenewAfter:       timestamppb.New(cert.RenewAfter),
		ServerTime:       timestamppb.New(g.cfg.Clock.Now()),
		ReattestGrace:    durationpb.New(g.cfg.ReattestGrace),
	}
}

// Secret hands the calling node a secret sealed for it.
func (j *joinService) Secret(ctx context.Context, req *sessionv1.SecretRequest) (*sessionv1.SecretResponse, error) {
	g := j.g
	id, err := g.authenticate(ctx, codes.PermissionDenied)
	if err != nil {
		return nil, err
	}
	name := req.GetName()
	if name == "" || len(name) > MaxSecretNameLen {
		return nil, status.Errorf(codes.InvalidArgument, "secret name must be 1 to %d bytes", MaxSecretNameLen)
	}
	entry := &store.AuditEntry{Actor: "node:" + id.nodeID, Action: "secret.read", Resource: "secret/" + name, SourceIP: peerIP(ctx)}
	if g.cfg.Secret == "" {
		return nil, status.Error(codes.Unavailable, "this gateway has no deployment secret to open secrets with")
	}
	s, err := g.store.SecretGet(ctx, name)
	if err == nil && s.NodeID != id.nodeID {
		// Another node's secret opens only with a grant for one command
		// (a site's BMC agent driving a silent node's BMC).
		granted, gerr := g.store.SecretGrantTake(ctx, name, id.nodeID, nil)
		if gerr != nil {
			return nil, g.internal(ctx, "secret", gerr)
		}
		if granted {
			entry.Action = "secret.read-granted"
			s.NodeID = id.nodeID
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && s.NodeID != id.nodeID):
		g.auditSecret(ctx, entry, admission.OutcomeRefused)
		return nil, status.Errorf(codes.NotFound, "secret %q does not exist or is not granted to node %s", name, id.nodeID)
	case err != nil:
		return nil, g.internal(ctx, "secret", err)
	}
	value, err := pki.Open(g.cfg.Secret, s.Sealed, pki.SecretAAD(name))
	if err != nil {
		return nil, g.internal(ctx, "secret", err)
	}
	g.auditSecret(ctx, entry, admission.OutcomeSuccess)
	return &sessionv1.SecretResponse{Name: name, Value: value}, nil
}

func (g *Gateway) auditSecret(ctx context.Context, e *store.AuditEntry, outcome string) {
	e.Outcome = outcome
	e.Details, _ = json.Marshal(map[string]string{"via": "gateway:" + g.cfg.ID})
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := g.store.AuditInsert(actx, e); err != nil {
		g.log.ErrorContext(ctx, "Audit write failed", "action", e.Action, logkey.Err, err)
	}
}
