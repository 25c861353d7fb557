package admission

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/better-compute/better-compute/controlplane/pki"
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
	// RevokeReasonRejoin is the reason recorded on the revocation of a
	// re-joined node's previous certificate.
	RevokeReasonRejoin = "re-join"
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

// Store is what admission reads and writes. Tx hands the transaction the
// whole store.
type Store interface {
	Tx(ctx context.Context, fn func(store.Store) error) error
	AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
}

// Config configures an Admitter.
type Config struct {
	// NodeCertTTL is the life of the node certificates issued. Defaults to
	// pki.DefaultNodeTTL (24 h).
	NodeCertTTL time.Duration
	// Now is the clock certificates are issued at. Defaults to time.Now.
	Now func() time.Time
}

// Admitter admits joining machines and renews node certificates. It is safe
// for concurrent use.
type Admitter struct {
	cfg    Config
	store  Store
	bundle *pki.Bundle
	log    *slog.Logger
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
	case st == nil || bundle == nil || log == nil:
		return nil, errors.New("admission: store, bundle and logger are required")
	}
	return &Admitter{cfg: cfg, store: st, bundle: bundle, log: log}, nil
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
}

// Admission is an admitted join.
type Admission struct {
	Node *store.Node
	Pool *store.Pool
	Site *store.Site
	// Cert is the node's new certificate.
	Cert *pki.Issued
	// Rejoined reports that an existing node of the pool was re-joined.
	Rejoined bool
	// RevokedSerial is the previous certificate's serial that a re-join
	// revoked; empty otherwise.
	RevokedSerial string
}

// auditDetails is the JSON of a join's or renewal's audit row.
type auditDetails struct {
	TokenID        string `json:"tokenId,omitempty"`
	PoolID         string `json:"poolId,omitempty"`
	Hostname       string `json:"hostname,omitempty"`
	MachineID      string `json:"machineId,omitempty"`
	Serial         string `json:"serial,omitempty"`
	Rejoined       bool   `json:"rejoined,omitempty"`
	RevokedSerial  string `json:"revokedSerial,omitempty"`
	PreviousSerial string `json:"previousSerial,omitempty"`
	Via            string `json:"via,omitempty"`
	Reason         string `json:"reason,omitempty"`
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
	cert, err := a.bundle.IssueNode(req.CSR, candidate, opts)
	switch {
	case errors.Is(err, pki.ErrCSRInvalid) || errors.Is(err, pki.ErrKeyType):
		return nil, a.refuse(ctx, entry, &details, fmt.Errorf("%w: %w: %w", ErrRefused, ErrInvalidRequest, err))
	case err != nil:
		return nil, a.fail(ctx, entry, &details, fmt.Errorf("join: %w", err))
	}

	adm := &Admission{}
	err = a.store.Tx(ctx, func(tx store.Store) error {
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
		var prev *store.Node
		nodeID := candidate
		if prev != nil {
			nodeID = prev.ID
		}
		notAfter := cert.NotAfter
		adm.Node, err = tx.NodeUpsert(ctx, &store.NodeUpsertParams{
			ID: nodeID, PoolID: adm.Pool.ID, Hostname: req.Facts.Hostname, MachineID: req.Facts.MachineID,
			Labels: req.Facts.Labels, BCDVersion: req.Facts.BCDVersion, OS: req.Facts.OS, Arch: req.Facts.Arch,
			CertSerial: cert.Serial, CertNotAfter: &notAfter,
		})
		if err != nil {
			return err
		}
		if prev != nil && prev.CertSerial != "" && prev.CertSerial != cert.Serial {
			err := tx.RevocationInsert(ctx, &store.Revocation{Serial: prev.CertSerial, NodeID: prev.ID, Reason: RevokeReasonRejoin})
			if err != nil {
				return err
			}
			adm.RevokedSerial = prev.CertSerial
		}
		adm.Cert = cert
		details.Serial, details.Rejoined, details.RevokedSerial = cert.Serial, adm.Rejoined, adm.RevokedSerial
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
	a.log.InfoContext(ctx, "Node joined", "node_id", adm.Node.ID, "pool_id", adm.Pool.ID, "hostname", adm.Node.Hostname,
		"rejoined", adm.Rejoined, "serial", cert.Serial, "source", req.Source)
	return adm, nil
}

// refuse writes the audit row of a refused join and returns err.
func (a *Admitter) refuse(ctx context.Context, entry *store.AuditEntry, d *auditDetails, err error) error {
	a.audit(ctx, entry, d, OutcomeRefused, err)
	a.log.InfoContext(ctx, "Join refused", "source", entry.SourceIP, "token_id", d.TokenID, "error", err)
	return err
}

// fail writes the audit row of a join that failed on the system's side and
// returns err.
func (a *Admitter) fail(ctx context.Context, entry *store.AuditEntry, d *auditDetails, err error) error {
	a.audit(ctx, entry, d, OutcomeError, err)
	a.log.ErrorContext(ctx, "Join failed", "source", entry.SourceIP, "token_id", d.TokenID, "error", err)
	return err
}

func (a *Admitter) audit(ctx context.Context, entry *store.AuditEntry, d *auditDetails, outcome string, cause error) {
	e := *entry
	d.Reason = cause.Error()
	e.Outcome, e.Details = outcome, mustJSON(d)
	// The audit row outlives a cancelled call: the attempt happened.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := a.store.AuditInsert(actx, &e); err != nil {
		a.log.ErrorContext(ctx, "Audit write failed", "action", e.Action, "error", err)
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
