package config

import (
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

// PublicHosts are the hosts of host.publicURL and host.gateway.publicURL,
// without duplicates: the names the serving certificates of the embedded
// default and of host.tls mode auto must hold beside the machine's own.
func (c *Config) PublicHosts() []string {
	var out []string
	for _, raw := range []string{c.Host.PublicURL, c.Host.Gateway.PublicURL} {
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
	if raw := c.Host.PublicURL; raw != "" {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return &Error{Key: "host.publicURL", Msg: "want the API's origin, http(s)://host[:port] with no path"}
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return &Error{Key: "host.publicURL", Msg: "invalid port " + p}
			}
		}
		c.Host.PublicURL = strings.TrimSuffix(u.String(), "/")
	}
	return nil
}
