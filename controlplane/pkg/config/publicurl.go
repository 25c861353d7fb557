package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// IsLoopbackHost reports whether host (a name or an address, without a
// port or brackets) is this machine only: "localhost", a name under
// ".localhost", 127.0.0.0/8 or ::1. Any other name is taken to be reachable
// from other machines.
func IsLoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// urlHost is the host of raw (no port, no brackets); "" when raw is not a
// URL with a host.
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// publicOffLoopback reports whether raw is a URL whose host other machines
// can reach.
func publicOffLoopback(raw string) bool {
	h := urlHost(raw)
	return h != "" && !IsLoopbackHost(h)
}

// APIScheme is "https" when the API serves TLS (host.tls.mode auto or
// files), else "http".
func (c *Config) APIScheme() string {
	if c.Host.TLS.Mode == TLSModeOff {
		return "http"
	}
	return "https"
}

// APIPublicHost is the host part of the API's public URL when the port is
// not known yet: host.publicURL's, else host.gateway.publicURL's, else
// "localhost".
func (c *Config) APIPublicHost() string {
	if h := urlHost(c.Host.PublicURL); h != "" {
		return h
	}
	if h := urlHost(c.Host.Gateway.PublicURL); h != "" {
		return h
	}
	return "localhost"
}

// PublicHosts are the hosts of host.publicURL, host.gateway.publicURL and
// host.gateway.ws.publicURL, without duplicates: the names the serving
// certificates of the embedded default and of host.tls mode auto must hold
// beside the machine's own.
func (c *Config) PublicHosts() []string {
	var out []string
	for _, raw := range []string{c.Host.PublicURL, c.Host.Gateway.PublicURL, c.Host.Gateway.WS.PublicURL} {
		if h := urlHost(raw); h != "" && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// defaultAPIPublicURL is the API's public URL derived from the gateway's
// host and host.listen's port; "" while the port is 0 (chosen at listen
// time: the API then derives it from the bound port).
func (c *Config) defaultAPIPublicURL() string {
	_, port, err := net.SplitHostPort(c.Host.Listen)
	if err != nil || port == "0" {
		return ""
	}
	return c.APIScheme() + "://" + net.JoinHostPort(c.APIPublicHost(), port)
}

// validateAPITLS checks host.tls and host.publicURL.
func (c *Config) validateAPITLS() error {
	t := c.Host.TLS
	switch t.Mode {
	case TLSModeOff, TLSModeAuto:
		if t.Cert != "" || t.Key != "" {
			return &Error{Key: "host.tls", Msg: fmt.Sprintf("cert and key are read only with mode files, not %s", t.Mode)}
		}
	case TLSModeFiles:
		if t.Cert == "" || t.Key == "" {
			return &Error{Key: "host.tls", Msg: "mode files needs cert and key (--api-tls-cert, --api-tls-key)"}
		}
	default:
		return &Error{Key: "host.tls.mode", Msg: fmt.Sprintf("%q: want off, auto or files", t.Mode)}
	}
	if t.Mode == TLSModeFiles {
		// Read now, before serve makes anything: a bad pair is a
		// configuration error (exit 2), not a failure after start.
		if _, err := tls.LoadX509KeyPair(t.Cert, t.Key); err != nil {
			return &Error{Key: "host.tls", Msg: fmt.Sprintf("cert %s and key %s: %v", t.Cert, t.Key, err)}
		}
	}
	if raw := c.Host.PublicURL; raw != "" {
		u, err := checkOrigin(raw, "https", "http")
		if err != nil {
			return &Error{Key: "host.publicURL", Msg: fmt.Sprintf("%q: %v", raw, err)}
		}
		c.Host.PublicURL = u
	}
	return nil
}

// checkOrigin checks that raw is an origin, scheme://host[:port] with one of
// schemes, a host, a port of 1 to 65535 when given, and no credentials,
// path, query or fragment (a URL advertised to machines and printed in
// commands carries nothing else). It returns raw without a trailing "/".
func checkOrigin(raw string, schemes ...string) (string, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "", fmt.Errorf("not a URL: %v", err)
	case !slices.Contains(schemes, u.Scheme):
		return "", fmt.Errorf("want %s://host[:port]", strings.Join(schemes, " or "))
	case u.Hostname() == "":
		return "", errors.New("no host: want scheme://host[:port]")
	case u.User != nil:
		return "", errors.New("credentials do not belong in it")
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.ForceQuery, u.Fragment != "":
		return "", errors.New("want an origin with no path, query or fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %s: want 1 to 65535", p)
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "", errors.New("empty port")
	}
	return strings.TrimSuffix(u.Scheme+"://"+u.Host, "/"), nil
}
