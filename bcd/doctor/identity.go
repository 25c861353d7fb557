package doctor

import (
	"crypto"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// RenewGrace is how long past its renew-after time a certificate may go
// unrenewed before doctor warns: the agent renews at that time, retrying
// with backoff.
const RenewGrace = 10 * time.Minute

// Certificate checks the node certificate: it matches the node key, chains
// to the node CA roots, is valid at now; it reports the time left and warns
// when the renewal is overdue. skew is this machine's clock minus the
// gateway's as bcd node last measured it (0: none): the certificate is
// judged at now − skew, as the gateway judges it.
func Certificate(id *identity.Identity, now time.Time, skew time.Duration) Result {
	if len(id.Chain) == 0 {
		return result(IDCertificate, "", Fail, "no node certificate: join again with bcd join --force")
	}
	leaf := id.Chain[0]
	target := identity.CertFile
	// 32 hex digits, as the control plane spells serials (pki.FormatSerial).
	detail := fmt.Sprintf("serial %032x, valid %s to %s, renew after %s", leaf.SerialNumber, leaf.NotBefore.UTC().Format(time.RFC3339),
		leaf.NotAfter.UTC().Format(time.RFC3339), id.RenewAfter.UTC().Format(time.RFC3339))
	if skew != 0 {
		now = now.Add(-skew)
		detail += fmt.Sprintf("; judged at %s, the gateway's time: this machine's clock is %d s off (bcd node's last measure, + ahead)",
			now.UTC().Format(time.RFC3339), int64(skew/time.Second))
	}
	if pub, ok := id.Key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(leaf.PublicKey) {
		return result(IDCertificate, target, Fail, "the certificate is not for the node key: join again with bcd join --force", detail)
	}
	roots := x509.NewCertPool()
	for _, c := range id.NodeCARoots {
		roots.AddCert(c)
	}
	inter := x509.NewCertPool()
	for _, c := range id.Chain[1:] {
		inter.AddCert(c)
	}
	// Chain regardless of time; validity is reported below.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: leaf.NotBefore.Add(time.Second),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return result(IDCertificate, target, Fail, "the certificate does not chain to the node CA roots: join again with bcd join --force", detail, err.Error())
	}
	switch left := leaf.NotAfter.Sub(now); {
	case left <= 0:
		return result(IDCertificate, target, Fail, fmt.Sprintf("the certificate expired %s ago: bcd node re-attests it by itself once it reaches a gateway, within the gateway's re-attestation grace (bcd status says how long is left)", (-left).Round(time.Second)), detail)
	case now.Before(leaf.NotBefore):
		return result(IDCertificate, target, Fail, fmt.Sprintf("the certificate is valid only from %s: this machine's clock is behind; fix NTP", leaf.NotBefore.UTC().Format(time.RFC3339)), detail)
	case now.After(id.RenewAfter.Add(RenewGrace)):
		return result(IDCertificate, target, Warn, fmt.Sprintf("renewal overdue by %s, %s left: check bcd node runs and reaches a gateway", roundLeft(now.Sub(id.RenewAfter)), roundLeft(left)), detail)
	default:
		return result(IDCertificate, target, OK, fmt.Sprintf("valid for %s more", roundLeft(left)), detail)
	}
}

// JoinToken parses the join token in path and returns its pin. A node that
// joined compares it with the pin it trusts gateways by: another pin means
// the token belongs to another deployment, or the gateway CA changed. Expiry,
// uses and revocation are known only to the control plane.
func JoinToken(path string, id *identity.Identity) (Result, string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return result(IDJoinToken, path, Fail, "cannot read the join token file", err.Error()), ""
	}
	tok, err := jointoken.Parse(string(b))
	if err != nil {
		return result(IDJoinToken, path, Fail, "not a join token: pass the whole token as join-tokens create printed it", err.Error()), ""
	}
	detail := fmt.Sprintf("token %s pins %s", tok.ID(), tok.Pin())
	if id != nil && id.GatewayPin != "" && id.GatewayPin != tok.Pin() {
		return result(IDJoinToken, path, Warn, "the token pins another gateway CA than this node trusts: it is from another deployment, or the CA changed",
			detail, "node trusts "+id.GatewayPin), tok.Pin()
	}
	return result(IDJoinToken, path, OK, "the token parses; its expiry and uses are known only to the control plane", detail), tok.Pin()
}

// roundLeft rounds d to minutes, or to seconds under ten minutes (short
// certificate lives).
func roundLeft(d time.Duration) time.Duration {
	if d < 10*time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Minute)
}
