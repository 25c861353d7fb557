package doctor

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Check ids of the internal control API and tunnels (docs/tunnels.md).
const (
	IDGatewayInternal = "host.gateway.internal"
	IDGatewayTunnels  = "host.gateway.tunnels"
)

// internalCertWarn is how close to its end an internal certificate makes
// host.gateway.internal warn.
const internalCertWarn = 30 * 24 * time.Hour

// InternalConfig is the internal control API part of Config
// (host.gateway.internal).
type InternalConfig struct {
	// CertFile and KeyFile are host.gateway.internal.tlsFiles; both empty
	// when the internal API is not configured.
	CertFile, KeyFile string
	// Address is host.gateway.internal.address (empty: derived from the
	// listen address).
	Address string
	// SplitRoles reports whether this configuration runs a subset of the
	// roles (api and gateway in separate processes).
	SplitRoles bool
	// Roles are the roles this process runs, when SplitRoles: the
	// internal certificate must name Address only in a process that runs
	// the gateway (which serves it); an api presents the certificate as a
	// client and a worker process uses none (issue 41). Empty: the api and
	// the gateway both.
	Roles []string
}

// runs reports whether the process runs role (api or gateway).
func (c InternalConfig) runs(role string) bool {
	return len(c.Roles) == 0 || slices.Contains(c.Roles, "all") || slices.Contains(c.Roles, role)
}

// Internal checks the internal control API the api uses to wake the
// gateway that holds a node's session and to push revocations. Not
// configured, it is ok: gateways are woken by LISTEN/NOTIFY
// (host.gateway.notifier) or their 1-second loop, and the all-in-one
// process wakes its gateway in memory. Configured, the certificate files
// must hold a key pair chaining to the bundle's internal CA (or issued by
// another internal CA of the trust domain, as one a rotation replaced:
// warn, the process re-issues it in memory) with an internal
// SPIFFE ID of the trust domain (fail otherwise), valid now and for 7 more
// days (fail) and for 30 more days (warn), naming the host of host.gateway.internal.address
// when it is set and this process runs the gateway, which serves it (fail;
// an api-only process presents it as a client, and its configuration may
// name the gateway's address beside it); and every live gateway should advertise an
// internal address (warn: the api falls back to NOTIFY for its nodes).
func Internal(bundle *pki.Bundle, cfg InternalConfig, gws []*store.Gateway, now time.Time, liveWithin time.Duration) Result {
	if !cfg.runs("api") && !cfg.runs("gateway") {
		return result(IDGatewayInternal, OK, "this process runs neither the api nor the gateway role: it uses no internal control API")
	}
	if cfg.CertFile == "" && cfg.KeyFile == "" {
		if cfg.SplitRoles {
			return result(IDGatewayInternal, OK, "not configured: the api wakes gateways through LISTEN/NOTIFY (host.gateway.notifier), every gateway of the deployment; "+
				"set host.gateway.internal.tlsFiles (better-compute pki issue-internal) to wake only the gateway holding a node's session")
		}
		return result(IDGatewayInternal, OK, "not configured: this process runs the api and the gateway, which it wakes in memory")
	}
	if bundle == nil {
		return result(IDGatewayInternal, Fail, "no PKI bundle to check the internal certificate against (see the pki check)")
	}
	pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return result(IDGatewayInternal, Fail, "host.gateway.internal.tlsFiles do not load: "+err.Error()+"; write them with better-compute pki issue-internal")
	}
	leaf := pair.Leaf
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	roots := x509.NewCertPool()
	roots.AddCert(bundle.InternalCA.Cert)
	// A certificate from another internal CA of the trust domain (a
	// rotation's old one, one it retired, or by name another deployment's)
	// is re-issued in memory from the CA in force by the process that
	// loads it (control.Identity): it works, and the files want renewing.
	otherCA := bundle.FromOtherInternalCA(leaf)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil && !otherCA {
		return result(IDGatewayInternal, Fail, "the internal certificate "+cfg.CertFile+" does not verify against the deployment's internal CA: "+err.Error()+
			"; re-issue it with better-compute pki issue-internal")
	}
	prefix := pki.InternalSPIFFEID(bundle.TrustDomain, "")
	if len(leaf.URIs) != 1 || !strings.HasPrefix(leaf.URIs[0].String(), prefix) {
		return result(IDGatewayInternal, Fail, "the internal certificate "+cfg.CertFile+" names no internal SPIFFE ID "+prefix+"<name>; re-issue it with better-compute pki issue-internal")
	}
	if a := cfg.Address; a != "" && cfg.runs("gateway") {
		if host, _, err := net.SplitHostPort(a); err == nil {
			if err := leaf.VerifyHostname(host); err != nil {
				return result(IDGatewayInternal, Fail, fmt.Sprintf("host.gateway.internal.address %s: the internal certificate does not name %s; re-issue it with pki issue-internal --dns/--ip %s", a, host, host))
			}
		}
	}
	left := leaf.NotAfter.Sub(now)
	detail := fmt.Sprintf("%s, valid until %s", leaf.URIs[0], leaf.NotAfter.UTC().Format(time.RFC3339))
	if left <= 0 || left < ServingCertFailWithin {
		return result(IDGatewayInternal, Fail, fmt.Sprintf("the internal certificate ends in %s: re-issue it now with better-compute pki issue-internal (files are re-read every 60 s)", days(max(left, 0))), detail)
	}
	if left < internalCertWarn {
		return result(IDGatewayInternal, Warn, fmt.Sprintf("the internal certificate ends in %s: re-issue it with better-compute pki issue-internal (files are re-read every 60 s)", days(left)), detail)
	}
	if otherCA {
		return result(IDGatewayInternal, Warn, "the internal certificate "+cfg.CertFile+" comes from another internal CA of the trust domain (one a rotation replaced, or another deployment's): "+
			"the process presents one re-issued in memory from the CA in force for the same key and names; renew the files with better-compute pki issue-internal", detail)
	}
	var without []string
	for _, g := range gws {
		if now.Sub(g.HeartbeatAt) < liveWithin && g.InternalAddress == "" {
			without = append(without, g.ID)
		}
	}
	if len(without) > 0 {
		return result(IDGatewayInternal, Warn, fmt.Sprintf("%d live gateway(s) serve no internal control API: their nodes are woken through LISTEN/NOTIFY; "+
			"set host.gateway.internal.tlsFiles in their configuration", len(without)), some(without))
	}
	return result(IDGatewayInternal, OK, "the internal certificate verifies; every live gateway advertises its internal address", detail)
}

// Tunnels checks that the api can open tunnels (nodes shell, nodes
// port-forward): the all-in-one process opens them on its own gateway;
// split roles relay them over the internal control API, so without it
// every tunnel is refused UNAVAILABLE (warn).
func Tunnels(cfg InternalConfig) Result {
	switch {
	case !cfg.runs("api") && !cfg.runs("gateway"):
		return result(IDGatewayTunnels, OK, "this process runs neither the api nor the gateway role: it opens no tunnels")
	case !cfg.SplitRoles:
		return result(IDGatewayTunnels, OK, "the api opens tunnels on the gateway of its own process (and over the internal control API when configured)")
	case cfg.CertFile != "" && cfg.KeyFile != "":
		return result(IDGatewayTunnels, OK, "the api relays tunnels to the gateway holding each node's session over the internal control API")
	}
	return result(IDGatewayTunnels, Warn, "split roles without the internal control API: nodes shell and port-forward are refused; "+
		"set host.gateway.internal.tlsFiles (better-compute pki issue-internal) in every api and gateway process")
}
