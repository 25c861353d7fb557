package doctor

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
)

// IDAPITLS is the id of the API's TLS check.
const IDAPITLS = "api.tls"

// APIConfig is the api role part of Config.
type APIConfig struct {
	// Enabled reports whether the configuration runs the api role.
	Enabled bool
	// Listen is the address the API listens on: the one a serve on the
	// data directory recorded (bootstrap.APIListenFile) when there is one,
	// else host.listen. Flags decide it as much as the file does (serve
	// --host and --port, dev's loopback default), so a check that read
	// host.listen alone warned about 0.0.0.0 beside every dev (issue 41).
	Listen string
	// ListenFrom names where Listen came from: "host.listen" or the
	// recorded file's path.
	ListenFrom string
	// TLSMode is host.tls.mode: off, auto or files.
	TLSMode string
	// CertFile and KeyFile are the serving certificate's files: host.tls's
	// for mode files, DataDir/pki/api.crt and api.key for mode auto.
	CertFile, KeyFile string
	// PublicURL is host.publicURL, the API's origin for other machines.
	PublicURL string
}

// apiConfig is the APIConfig of c.
func apiConfig(c *config.Config) APIConfig {
	a := APIConfig{Enabled: c.Runs("api"), Listen: c.Host.Listen, ListenFrom: "host.listen", TLSMode: c.Host.TLS.Mode, PublicURL: c.Host.PublicURL}
	if l, path := bootstrap.RecordedAPIListen(c.DataDir); l != "" {
		a.Listen, a.ListenFrom = l, path
	}
	if u, _ := bootstrap.RecordedAPIURL(c.DataDir); a.TLSMode == config.TLSModeOff && strings.HasPrefix(u, "https://") {
		// The serve on this data directory was told to serve TLS by a
		// flag (--public-url, --api-tls) that no file shows: judge the
		// API as it runs, by the URL it recorded.
		a.TLSMode = config.TLSModeAuto
	}
	switch a.TLSMode {
	case config.TLSModeFiles:
		a.CertFile, a.KeyFile = c.Host.TLS.Cert, c.Host.TLS.Key
	case config.TLSModeAuto:
		dir := filepath.Join(c.DataDir, bootstrap.PKIDir)
		a.CertFile, a.KeyFile = filepath.Join(dir, bootstrap.APICertFile), filepath.Join(dir, bootstrap.APIKeyFile)
	}
	return a
}

// listenDetail is the listen address and where it was read.
func listenDetail(a APIConfig) string {
	if a.ListenFrom == "" {
		return a.Listen
	}
	return a.Listen + " (" + a.ListenFrom + ")"
}

// APITLS checks how the API serves. Plain HTTP on a listen address other
// machines reach warns (API tokens and join tokens would cross the network
// in clear text), unless the API's public URL is https (a proxy in front
// terminates TLS). With TLS, a certificate that cannot be read, does not
// match its key or has expired fails, one not valid yet fails, one within
// 7 days of its end (ServingCertFailWithin) fails and one within 30 days
// warns. Mode auto before the first start (no
// files yet) is ok: serve issues them.
func APITLS(a APIConfig, now time.Time) Result {
	if !a.Enabled {
		return result(IDAPITLS, OK, "this configuration runs no api role")
	}
	if a.TLSMode == config.TLSModeOff || a.TLSMode == "" {
		host, _, err := net.SplitHostPort(a.Listen)
		if err == nil && host != "" && config.IsLoopbackHost(host) {
			return result(IDAPITLS, OK, "the API serves plain HTTP on loopback only", listenDetail(a))
		}
		if u, err := url.Parse(a.PublicURL); err == nil && u.Scheme == "https" {
			return result(IDAPITLS, OK, "the API serves plain HTTP behind "+a.PublicURL+" (host.publicURL): the proxy in front must terminate TLS", listenDetail(a))
		}
		return result(IDAPITLS, Warn, "the API serves plain HTTP on "+a.Listen+", which other machines reach: API and join tokens cross the network in clear text; serve HTTPS with --api-tls auto (host.tls.mode: auto) or files",
			listenDetail(a))
	}
	pair, err := tls.LoadX509KeyPair(a.CertFile, a.KeyFile)
	if a.TLSMode == config.TLSModeAuto && errors.Is(err, fs.ErrNotExist) {
		return result(IDAPITLS, OK, "host.tls mode auto: serve issues the API certificate at its first start", a.CertFile)
	}
	if err != nil {
		return result(IDAPITLS, Fail, "cannot load the API certificate: "+err.Error(), a.CertFile)
	}
	leaf := pair.Leaf
	names := append(append([]string{}, leaf.DNSNames...), ipStrings(leaf)...)
	detail := fmt.Sprintf("%s (mode %s) names %s, valid until %s", a.CertFile, a.TLSMode, strings.Join(names, ", "),
		leaf.NotAfter.UTC().Format(time.RFC3339))
	switch left := leaf.NotAfter.Sub(now); {
	case left <= 0:
		if a.TLSMode == config.TLSModeAuto {
			return result(IDAPITLS, Fail, "the API certificate has expired: clients refuse it; restart serve to re-issue it", detail)
		}
		return result(IDAPITLS, Fail, "the API certificate has expired: clients refuse it; replace host.tls.cert (the API reloads it within 60 s)", detail)
	case now.Before(leaf.NotBefore):
		return result(IDAPITLS, Fail, "the API certificate is not valid yet: check the clock", detail)
	case left < ServingCertFailWithin && a.TLSMode == config.TLSModeAuto:
		return result(IDAPITLS, Fail, fmt.Sprintf("the API certificate ends in %s: serve re-issues it 30 days before its end, so it is not running or cannot write %s; restart it", days(left), a.CertFile), detail)
	case left < ServingCertFailWithin:
		return result(IDAPITLS, Fail, fmt.Sprintf("the API certificate ends in %s: replace host.tls.cert now (the API reloads it within 60 s)", days(left)), detail)
	case left < GatewayCertWarnWithin && a.TLSMode == config.TLSModeAuto:
		return result(IDAPITLS, Warn, fmt.Sprintf("the API certificate ends in %s: a running serve re-issues it within the hour", days(left)), detail)
	case left < GatewayCertWarnWithin:
		return result(IDAPITLS, Warn, fmt.Sprintf("the API certificate ends in %s: replace host.tls.cert (the API reloads it within 60 s)", days(left)), detail)
	}
	if u, err := url.Parse(a.PublicURL); err == nil && u.Hostname() != "" {
		if err := leaf.VerifyHostname(u.Hostname()); err != nil {
			return result(IDAPITLS, Warn, fmt.Sprintf("the API certificate does not name %s (the API's public URL): clients that check names refuse it (nodes add's line pins the key and still works)", u.Hostname()), detail)
		}
	}
	return result(IDAPITLS, OK, "the API serves HTTPS", detail)
}
