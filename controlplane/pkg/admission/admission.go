package admission

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// Audit log vocabulary of admission.
const (
	// ActionJoin is the audit action of every join attempt.
	ActionJoin = "node.join"
	// ActionRenew is the audit action of every certificate renewal.
	ActionRenew = "node.renew"
	// OutcomeSuccess marks an admitted join or a renewal.
	OutcomeSuccess = "success"
	// OutcomeRefused marks a refused join or renewal.
	OutcomeRefused = "refused"
	// OutcomeError marks an attempt that failed on the system's side.
	OutcomeError = "error"
	// ActionReattest is the audit action of every re-attestation.
	ActionReattest = "node.reattested"
	// RevokeReasonReinstall is the reason recorded on the revocation of the
	// previous certificate of a node a reinstall token re-joined.
	RevokeReasonReinstall = "reinstall"
)

// Errors of Join and Renew, matched with errors.Is.
var (
	// ErrRefused wraps every refusal: the caller's token or request does
	// not allow the join. The cause is wrapped beside it.
	ErrRefused = errors.New("join refused")
	// ErrTokenMalformed reports a token string that is not a join token at
	// all (package jointoken could not parse it).
	ErrTokenMalformed = errors.New("join token malformed")
	// ErrInvalidRequest reports a malformed request: a bad CSR (wrapped
	// with the pki error) or facts outside their limits.
	ErrInvalidRequest = errors.New("invalid join request")
	// ErrUnknownNode reports a proof, re-attestation or reinstall token
	// naming a node this deployment does not have (deleted).
	ErrUnknownNode = errors.New("unknown node")
	// ErrNotLatestKey reports a proof by a key that is not the key of the
	// node's latest certificate.
	ErrNotLatestKey = errors.New("not the node's latest key")
	// ErrNodeRevoked reports a join (a retry with the same token and key,
	// or a proof of the node's key) or a re-attestation for a revoked node
	// or certificate. Revocation is final: only a reinstall token brings
	// the machine back, as a new node.
	ErrNodeRevoked = errors.New("node revoked")
	// ErrGracePassed reports a re-attestation of a certificate that expired
	// longer ago than Config.ReattestGrace, or with re-attestation off.
	ErrGracePassed = errors.New("re-attestation grace passed")
)

// Limits on what a joining machine may send.
const (
	// MaxCSRSize is the largest CSR accepted, in bytes.
	MaxCSRSize = 16 << 10
	// MaxHostnameLen is the longest hostname, in bytes (RFC 1035 §2.3.4).
	MaxHostnameLen = 253
	// MaxFactLen is the longest machine id, OS, architecture, bcd version
	// or boot id, in bytes.
	MaxFactLen = 128
	// MaxLabels is the most labels a node may bring.
	MaxLabels = 64
	// MaxLabelKeyLen and MaxLabelValueLen bound one label, in bytes.
	MaxLabelKeyLen   = 63
	MaxLabelValueLen = 253
)

// Store is what admission reads and writes. Its transactions receive the
// small interface of what they touch (joinTx, renewTx).
type Store interface {
	store.Transactor
	AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
}

// joinTx is what a join's transaction touches: the join token, the pool
// and site, the node and its certificate's revocations, and the audit row.
type joinTx interface {
	JoinTokenConsume(ctx context.Context, id string, secretHash []byte, now *time.Time) (*store.JoinToken, error)
	JoinTokenCheck(ctx context.Context, id string, secretHash []byte, now *time.Time) (*store.JoinToken, error)
	PoolGet(ctx context.Context, idOrName string) (*store.Pool, error)
	SiteGet(ctx context.Context, idOrName string) (*store.Site, error)
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	NodeFindByJoinKey(ctx context.Context, tokenID, keySHA256 string) (*store.Node, error)
	NodeFindByHostname(ctx context.Context, poolID, hostname string) (*store.Node, error)
	NodeUpsert(ctx context.Context, p *store.NodeUpsertParams) (*store.Node, error)
	NodeSetCertificate(ctx context.Context, p *store.NodeSetCertificateParams) error
	RevocationInsert(ctx context.Context, r *store.Revocation) error
	RevocationCheck(ctx context.Context, serial string) (bool, error)
	AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
}

// renewTx is what a renewal's or a re-attestation's transaction touches:
// the node's certificate and the audit row.
type renewTx interface {
	NodeSetCertificate(ctx context.Context, p *store.NodeSetCertificateParams) error
	AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
}

// proofTx is what checking a proven key reads (provenNode).
type proofTx interface {
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	RevocationCheck(ctx context.Context, serial string) (bool, error)
}

// reattestTx is what a re-attestation's transaction touches: the proof's
// node and revocations, its new certificate and the audit row.
type reattestTx interface {
	renewTx
	proofTx
}

// Config configures an Admitter.
type Config struct {
	// NodeCertTTL is the life of the node certificates issued. Defaults to
	// pki.DefaultNodeTTL (24 h).
	NodeCertTTL time.Duration
	// ReattestGrace is how long after its expiry a node's certificate can
	// still be renewed by Reattest (DESIGN.md, "Re-attestation after an
	// outage"). Zero turns re-attestation off; the configuration's
	// pki.reattestGrace defaults to DefaultReattestGrace.
	ReattestGrace time.Duration
	// Now is the clock certificates are issued at. Defaults to time.Now.
	Now func() time.Time
}

// DefaultReattestGrace is pki.reattestGrace's default: 7 days.
const DefaultReattestGrace = 7 * 24 * time.Hour

// Admitter admits joining machines and renews node certificates. It is safe
// for concurrent use.
type Admitter struct {
	cfg   Config
	store Store
	// bundle is the bundle it issues from; SetBundle replaces it when a
	// node-CA rotation changes the issuer.
	bundle atomic.Pointer[pki.Bundle]
	log    *slog.Logger
	// refusals summarises the refusals before a token is known good.
	refusals *refusalSummary
}

// New returns an Admitter issuing from bundle's node CA.
func New(cfg Config, st Store, bundle *pki.Bundle, log *slog.Logger) (*Admitter, error) {
	cfg.NodeCertTTL = cmp.Or(cfg.NodeCertTTL, pki.DefaultNodeTTL)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch {
	case cfg.NodeCertTTL < 0:
		return nil, fmt.Errorf("admission: node certificate TTL %s is negative", cfg.NodeCertTTL)
	case cfg.ReattestGrace < 0:
		return nil, fmt.Errorf("admission: re-attestation grace %s is negative", cfg.ReattestGrace)
	case st == nil || bundle == nil || log == nil:
		return nil, errors.New("admission: store, bundle and logger are required")
	}
	a := &Admitter{cfg: cfg, store: st, log: log, refusals: newRefusalSummary()}
	a.bundle.Store(bundle)
	return a, nil
}

// SetBundle makes the Admitter issue from b from now on: the gateway calls
// it when it reads a changed bundle from the database (a node-CA rotation).
// A nil b is ignored.
func (a *Admitter) SetBundle(b *pki.Bundle) {
	if b != nil {
		a.bundle.Store(b)
	}
}

// Facts is what a joining machine says about itself. It names and places the
// node; nothing in it is trusted for authorisation.
type Facts struct {
	Hostname   string
	MachineID  string
	OS         string
	Arch       string
	BCDVersion string
	BootID     string
	// Labels apply to a new node; a re-joined node keeps its own.
	Labels map[string]string
}

// Request is one join attempt.
type Request struct {
	// Token is the join token string as created by join-tokens create.
	Token string
	// CSR is the DER PKCS #10 request for the node's key.
	CSR   []byte
	Facts Facts
	// Source is the caller's address (the verified socket peer), recorded
	// in the audit log.
	Source string
	// Via names the component that took the call, such as "gateway:gw_…",
	// recorded in the audit details.
	Via string
	// Proven is set when the caller proved an existing node's key on this
	// connection (the gateway checked the KeyProof): the join then takes
	// that node's id, without revoking its live certificate.
	Proven *ProvenKey
}

// ProvenKey is a node key the caller proved it holds: the gateway verified a
// KeyProof by that key, over a nonce of the caller's connection, with a
// certificate chain from the node CA naming the node.
type ProvenKey struct {
	// NodeID is the node the proof's certificate names.
	NodeID string
	// KeySHA256 is pki.KeySHA256 of the proven key.
	KeySHA256 string
	// Serial is the proof's certificate serial (pki.FormatSerial).
	Serial string
	// NotAfter is the proof's certificate's end of validity.
	NotAfter time.Time
}

// Admission is an admitted join.
type Admission struct {
	Node *store.Node
	Pool *store.Pool
	Site *store.Site
	// Cert is the node's new certificate.
	Cert *pki.Issued
	// Rejoined reports that the join took an existing node's id: by a
	// proof of its key or a reinstall token.
	Rejoined bool
	// Repeated reports a Join repeated with the same token and key: the
	// node it made before, with a fresh certificate, no token use spent.
	Repeated bool
	// RevokedSerial is the previous certificate's serial that a reinstall
	// revoked; empty otherwise.
	RevokedSerial string
	// Warnings are for the person running the join (another node has the
	// hostname).
	Warnings []string
}

// auditDetails is the JSON of a join's or renewal's audit row.
type auditDetails struct {
	TokenID        string `json:"tokenId,omitempty"`
	PoolID         string `json:"poolId,omitempty"`
	Hostname       string `json:"hostname,omitempty"`
	MachineID      string `json:"machineId,omitempty"`
	Serial         string `json:"serial,omitempty"`
	Rejoined       bool   `json:"rejoined,omitempty"`
	Repeated       bool   `json:"repeated,omitempty"`
	ProvenSerial   string `json:"provenSerial,omitempty"`
	SameHostnameAs string `json:"sameHostnameAs,omitempty"`
	NotAfter       string `json:"notAfter,omitempty"`
	RevokedSerial  string `json:"revokedSerial,omitempty"`
	RevokedNode    string `json:"revokedNode,omitempty"`
	PreviousSerial string `json:"previousSerial,omitempty"`
	Via            string `json:"via,omitempty"`
	Reason         string `json:"reason,omitempty"`
	// Refusal, Refusals and Since summarise the refusals of one reason
	// from one source (refusalSummary): this row stands for Refusals of
	// them since Since, the last of which it describes.
	Refusal  string `json:"refusal,omitempty"`
	Refusals int    `json:"refusals,omitempty"`
	Since    string `json:"since,omitempty"`
}

// Join admits the machine of req or refuses it; see the package
// documentation for the checks. Refusals wrap ErrRefused.
func (a *Admitter) Join(ctx context.Context, req *Request) (*Admission, error) {
	details := auditDetails{Hostname: clip(req.Facts.Hostname, MaxHostnameLen), MachineID: clip(req.Facts.MachineID, MaxFactLen), Via: req.Via}
	entry := &store.AuditEntry{Actor: "join-token", Action: ActionJoin, Resource: "join-token", SourceIP: req.Source}

	tok, err := jointoken.Parse(req.Token)
	if err != nil {
		return nil, a.refuse(ctx, entry, &details, fmt.Errorf("%w: %w", ErrRefused, ErrTokenMalformed))
	}
	details.TokenID = tok.ID()
	entry.Actor = "join-token:" + tok.ID()
	entry.Resource = "join-token/" + tok.ID()
	if err := validateFacts(&req.Facts); err != nil {
		return nil, a.refuse(ctx, entry, &details, fmt.Errorf("%w: %w: %w", ErrRefused, ErrInvalidRequest, err))
	}
	if len(req.CSR) > MaxCSRSize {
		return nil, a.refuse(ctx, entry, &details, fmt.Errorf("%w: %w: CSR is %d bytes, at most %d", ErrRefused, ErrInvalidRequest, len(req.CSR), MaxCSRSize))
	}
	// Issuing for a fresh id checks the CSR before anything is written; a
	// re-join issues again below for the node's own id.
	opts := pki.IssueOptions{Now: a.cfg.Now(), TTL: a.cfg.NodeCertTTL}
	candidate := store.NewID("node")
	cert, err := a.issue(ctx, req.CSR, candidate, opts)
	switch {
	case errors.Is(err, pki.ErrCSRInvalid) || errors.Is(err, pki.ErrKeyType):
		return nil, a.refuse(ctx, entry, &details, fmt.Errorf("%w: %w: %w", ErrRefused, ErrInvalidRequest, err))
	case err != nil:
		return nil, a.fail(ctx, entry, &details, fmt.Errorf("join: %w", err))
	}

	adm := &Admission{}
	err = store.InTx(ctx, a.store, func(tx joinTx) error {
		// A repeated Join (same token, same key: a lost reply) answers
		// with the node it made and uses nothing (DESIGN.md, "Join is
		// idempotent per key").
		// With a proof, only when it names that same node (bcd join --force
		// retried after its reply was lost).
		prev, err := tx.NodeFindByJoinKey(ctx, tok.ID(), cert.KeySHA256)
		switch {
		case err == nil && (req.Proven == nil || req.Proven.NodeID == prev.ID):
			return a.repeat(ctx, tx, req, tok, prev, opts, adm, entry, &details)
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return err
		}
		t, err := tx.JoinTokenConsume(ctx, tok.ID(), tok.SecretHash(), nil)
		if err != nil {
			if isTokenRefusal(err) {
				return fmt.Errorf("%w: %w", ErrRefused, err)
			}
			return err
		}
		details.PoolID = t.PoolID
		if adm.Pool, err = tx.PoolGet(ctx, t.PoolID); err != nil {
			return err
		}
		if adm.Site, err = tx.SiteGet(ctx, adm.Pool.SiteID); err != nil {
			return err
		}
		prev, revokePrev, err := a.existing(ctx, tx, t, req)
		if err != nil {
			return err
		}
		nodeID := candidate
		if prev != nil && revokePrev {
			// A reinstall token for a revoked node brings the machine back
			// as a new node: the revoked identity stays revoked, with its
			// history (docs/pki.md, "Revocation is final").
			revoked, err := nodeRevoked(ctx, tx, prev)
			if err != nil {
				return err
			}
			if revoked {
				adm.Warnings = append(adm.Warnings, fmt.Sprintf(
					"node %s is revoked and stays so: this machine joined as a new node with the reinstall token made for it", prev.ID))
				details.RevokedNode = prev.ID
				prev, revokePrev = nil, false
			}
		}
		if prev != nil {
			adm.Rejoined, nodeID = true, prev.ID
			if cert, err = a.issue(ctx, req.CSR, prev.ID, opts); err != nil {
				return fmt.Errorf("issue certificate for re-joined node %s: %w", prev.ID, err)
			}
		} else if details.RevokedNode != "" {
			// The warning above says what happened.
		} else if twin, err := tx.NodeFindByHostname(ctx, adm.Pool.ID, req.Facts.Hostname); err == nil {
			// A name alone never makes a machine an existing node.
			adm.Warnings = append(adm.Warnings, fmt.Sprintf(
				"node %s of pool %s already has hostname %q: this machine joined as a new node; to take that node's place after a reinstall, use a token from better-compute nodes reinstall %s",
				twin.ID, adm.Pool.Name, req.Facts.Hostname, twin.ID))
			details.SameHostnameAs = twin.ID
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		notAfter := cert.NotAfter
		adm.Node, err = tx.NodeUpsert(ctx, &store.NodeUpsertParams{
			ID: nodeID, PoolID: adm.Pool.ID, Hostname: req.Facts.Hostname, MachineID: req.Facts.MachineID,
			Labels: req.Facts.Labels, BCDVersion: req.Facts.BCDVersion, OS: req.Facts.OS, Arch: req.Facts.Arch,
			CertSerial: cert.Serial, CertNotAfter: &notAfter, KeySHA256: cert.KeySHA256, JoinTokenID: t.ID, CertCAID: cert.CAID,
		})
		if err != nil {
			return err
		}
		if revokePrev && prev.CertSerial != "" && prev.CertSerial != cert.Serial {
			err := tx.RevocationInsert(ctx, &store.Revocation{Serial: prev.CertSerial, NodeID: prev.ID, Reason: RevokeReasonReinstall})
			if err != nil {
				return err
			}
			adm.RevokedSerial = prev.CertSerial
		}
		adm.Cert = cert
		details.Serial, details.Rejoined, details.RevokedSerial = cert.Serial, adm.Rejoined, adm.RevokedSerial
		if req.Proven != nil {
			details.ProvenSerial = req.Proven.Serial
		}
		ok := *entry
		ok.Resource, ok.Outcome, ok.Details = "node/"+nodeID, OutcomeSuccess, mustJSON(details)
		_, err = tx.AuditInsert(ctx, &ok)
		return err
	})
	switch {
	case errors.Is(err, ErrRefused):
		return nil, a.refuse(ctx, entry, &details, err)
	case err != nil:
		return nil, a.fail(ctx, entry, &details, fmt.Errorf("join: %w", err))
	}
	a.log.InfoContext(ctx, "Node joined", logkey.NodeID, adm.Node.ID, "pool_id", adm.Pool.ID, "hostname", adm.Node.Hostname,
		"rejoined", adm.Rejoined, "repeated", adm.Repeated, "serial", adm.Cert.Serial, "source", req.Source)
	return adm, nil
}

// existing returns the node a join takes over, if any, and whether its
// certificate is to be revoked: the node a reinstall token names (its
// machine was wiped: the old key is gone, so its certificate is revoked),
// or the node whose current key the caller proved (never revoked: the
// machine is the node). A mismatch refuses the join.
func (a *Admitter) existing(ctx context.Context, tx joinTx, t *store.JoinToken, req *Request) (prev *store.Node, revoke bool, err error) {
	switch {
	case t.NodeID != "":
		prev, err = tx.NodeGet(ctx, t.NodeID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, false, fmt.Errorf("%w: %w: node %s, which this reinstall token was made for, no longer exists", ErrRefused, ErrUnknownNode, t.NodeID)
		}
		return prev, true, err
	case req.Proven != nil:
		prev, err := a.provenNode(ctx, tx, req.Proven)
		return prev, false, err
	}
	return nil, false, nil
}

// provenNode returns the node whose key p proves: it must exist, p's key
// must be the key of its latest certificate, and neither that certificate
// nor the proof's is revoked.
func (a *Admitter) provenNode(ctx context.Context, tx proofTx, p *ProvenKey) (*store.Node, error) {
	n, err := tx.NodeGet(ctx, p.NodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("%w: %w: node %s", ErrRefused, ErrUnknownNode, p.NodeID)
	case err != nil:
		return nil, err
	}
	// Nodes joined before keys were recorded are named by their serial.
	latest := n.KeySHA256 == p.KeySHA256 || (n.KeySHA256 == "" && n.CertSerial == p.Serial)
	if !latest {
		return nil, fmt.Errorf("%w: %w: node %s has a newer key than the one proven", ErrRefused, ErrNotLatestKey, n.ID)
	}
	for _, serial := range []string{p.Serial, n.CertSerial} {
		if serial == "" {
			continue
		}
		revoked, err := tx.RevocationCheck(ctx, serial)
		if err != nil {
			return nil, err
		}
		if revoked {
			return nil, revokedRefusal(n.ID, serial)
		}
	}
	return n, nil
}

// nodeRevoked reports whether n is revoked: its current certificate's
// serial is (pki.revoke of the node or the serial; a node deleted is gone
// altogether). A node a reinstall re-joined has a new, unrevoked serial.
func nodeRevoked(ctx context.Context, tx joinTx, n *store.Node) (bool, error) {
	if n.CertSerial == "" {
		return false, nil
	}
	revoked, err := tx.RevocationCheck(ctx, n.CertSerial)
	if err != nil {
		return false, fmt.Errorf("check revocation of node %s: %w", n.ID, err)
	}
	return revoked, nil
}

// revokedRefusal is the refusal of every way back for a revoked node: a
// join retried with its token and key, bcd join --force (a proof of its
// key) and re-attestation.
func revokedRefusal(nodeID, serial string) error {
	return fmt.Errorf("%w: %w: node %s (certificate %s) is revoked, and revocation is final: "+
		"only a token from better-compute nodes reinstall %s (an admin's) brings this machine back, as a new node",
		ErrRefused, ErrNodeRevoked, nodeID, serial, nodeID)
}

// repeat answers a Join repeated with the same token and key: the same
// node, a fresh certificate, no token use. The token must still be valid
// (known secret, not revoked, within its TTL), and the node not revoked: a
// revoked node never walks back in with its old token (ErrNodeRevoked).
func (a *Admitter) repeat(ctx context.Context, tx joinTx, req *Request, tok jointoken.Token, n *store.Node,
	opts pki.IssueOptions, adm *Admission, entry *store.AuditEntry, details *auditDetails) error {
	if _, err := tx.JoinTokenCheck(ctx, tok.ID(), tok.SecretHash(), nil); err != nil {
		if isTokenRefusal(err) {
			return fmt.Errorf("%w: %w", ErrRefused, err)
		}
		return err
	}
	revoked, err := nodeRevoked(ctx, tx, n)
	if err != nil {
		return err
	}
	if revoked {
		entry.Resource = "node/" + n.ID
		return revokedRefusal(n.ID, n.CertSerial)
	}
	details.PoolID = n.PoolID
	if adm.Pool, err = tx.PoolGet(ctx, n.PoolID); err != nil {
		return err
	}
	if adm.Site, err = tx.SiteGet(ctx, adm.Pool.SiteID); err != nil {
		return err
	}
	if adm.Cert, err = a.issue(ctx, req.CSR, n.ID, opts); err != nil {
		return fmt.Errorf("issue certificate for node %s: %w", n.ID, err)
	}
	err = tx.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{
		ID: n.ID, Serial: adm.Cert.Serial, NotAfter: adm.Cert.NotAfter, KeySHA256: adm.Cert.KeySHA256, CAID: adm.Cert.CAID,
	})
	if err != nil {
		return err
	}
	if adm.Node, err = tx.NodeGet(ctx, n.ID); err != nil {
		return err
	}
	adm.Repeated = true
	details.Serial, details.Repeated = adm.Cert.Serial, true
	ok := *entry
	ok.Resource, ok.Outcome, ok.Details = "node/"+n.ID, OutcomeSuccess, mustJSON(details)
	_, err = tx.AuditInsert(ctx, &ok)
	return err
}

// fail writes the audit row of a join that failed on the system's side and
// returns err.
func (a *Admitter) fail(ctx context.Context, entry *store.AuditEntry, d *auditDetails, err error) error {
	a.audit(ctx, entry, d, OutcomeError, err)
	a.log.ErrorContext(ctx, "Join failed", "source", entry.SourceIP, "token_id", d.TokenID, logkey.Err, err)
	return err
}

func (a *Admitter) audit(ctx context.Context, entry *store.AuditEntry, d *auditDetails, outcome string, cause error) {
	e := *entry
	if cause != nil {
		d.Reason = cause.Error()
	}
	e.Outcome, e.Details = outcome, mustJSON(d)
	// The audit row outlives a cancelled call: the attempt happened.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := a.store.AuditInsert(actx, &e); err != nil {
		a.log.ErrorContext(ctx, "Audit write failed", "action", e.Action, logkey.Err, err)
	}
}

// IsTokenRefusal reports whether err refuses a join because of its token
// (unknown, malformed, expired, revoked or used up) rather than its request.
func IsTokenRefusal(err error) bool {
	return errors.Is(err, ErrRefused) && (errors.Is(err, ErrTokenMalformed) || isTokenRefusal(err))
}

func isTokenRefusal(err error) bool {
	return errors.Is(err, store.ErrTokenInvalid) || errors.Is(err, store.ErrTokenExpired) ||
		errors.Is(err, store.ErrTokenRevoked) || errors.Is(err, store.ErrTokenExhausted)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("admission: encode audit details: %v", err))
	}
	return b
}

// clip shortens s to at most n bytes for the audit log.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
