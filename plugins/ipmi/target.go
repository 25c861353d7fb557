package ipmi

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode"

	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// Defaults of BMCTarget fields (plugin.proto).
const (
	DefaultTimeout     = 30 * time.Second
	DefaultIPMIPort    = 623
	DefaultCipherSuite = "3"
	DefaultRedfishPort = 443
)

// defaultProviders is the order tried when a target names none.
var defaultProviders = []pluginv1.Provider{pluginv1.Provider_PROVIDER_IPMITOOL, pluginv1.Provider_PROVIDER_REDFISH}

// target is a checked BMCTarget with its defaults filled in.
type target struct {
	address   string // as given: for messages
	host      string // for bmclib: IPv6 literals in brackets
	username  string
	password  string
	providers []pluginv1.Provider
	timeout   time.Duration
	ipmiPort  int
	cipher    string
	rfPort    int
	rfCAs     *x509.CertPool // nil: the certificate is not verified
}

// parseTarget checks t and fills in its defaults. Its errors hold no secret.
func parseTarget(t *pluginv1.BMCTarget) (*target, error) {
	if t == nil {
		return nil, errors.New("no BMC target")
	}
	addr := t.GetAddress()
	if err := checkAddress(addr); err != nil {
		return nil, err
	}
	if t.GetUsername() == "" {
		return nil, fmt.Errorf("bmc %s: no user name", addr)
	}
	if strings.IndexFunc(t.GetUsername(), unicode.IsControl) >= 0 {
		return nil, fmt.Errorf("bmc %s: the user name holds control characters", addr)
	}
	out := &target{
		address:  addr,
		host:     addr,
		username: t.GetUsername(),
		password: t.GetPassword(),
		timeout:  DefaultTimeout,
		ipmiPort: DefaultIPMIPort,
		cipher:   DefaultCipherSuite,
		rfPort:   DefaultRedfishPort,
	}
	if ip := net.ParseIP(addr); ip != nil && ip.To4() == nil {
		out.host = "[" + addr + "]"
	}
	if d := t.GetTimeout(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return nil, fmt.Errorf("bmc %s: invalid timeout", addr)
		}
		if d.AsDuration() > 0 {
			out.timeout = d.AsDuration()
		}
	}
	seen := map[pluginv1.Provider]bool{}
	for _, p := range t.GetProviders() {
		if _, ok := providerNames[p]; !ok {
			return nil, fmt.Errorf("bmc %s: unknown provider %v", addr, p)
		}
		if !seen[p] {
			seen[p] = true
			out.providers = append(out.providers, p)
		}
	}
	if len(out.providers) == 0 {
		out.providers = defaultProviders
	}
	if p := t.GetIpmiPort(); p != 0 {
		if p > 65535 {
			return nil, fmt.Errorf("bmc %s: invalid IPMI port %d", addr, p)
		}
		out.ipmiPort = int(p)
	}
	if c := t.GetIpmiCipherSuite(); c != "" {
		if n, err := strconv.Atoi(c); err != nil || n < 0 || n > 255 {
			return nil, fmt.Errorf("bmc %s: invalid IPMI cipher suite %q", addr, c)
		}
		out.cipher = c
	}
	if p := t.GetRedfishPort(); p != 0 {
		if p > 65535 {
			return nil, fmt.Errorf("bmc %s: invalid Redfish port %d", addr, p)
		}
		out.rfPort = int(p)
	}
	if pem := t.GetRedfishCaPem(); len(pem) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("bmc %s: redfish_ca_pem holds no PEM certificate", addr)
		}
		out.rfCAs = pool
	}
	return out, nil
}

// checkAddress accepts a host name or an IP address, without a port, a
// scheme or anything a URL or a command line could trip on.
func checkAddress(addr string) error {
	switch {
	case addr == "":
		return errors.New("no BMC address")
	case len(addr) > 253:
		return errors.New("BMC address longer than 253 characters")
	case net.ParseIP(addr) != nil:
		return nil
	case strings.HasPrefix(addr, "-"):
		return fmt.Errorf("bmc %q: an address cannot start with '-'", addr)
	}
	for _, r := range addr {
		if !(r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return fmt.Errorf("bmc %q: not a host name or IP address (give the port in ipmi_port or redfish_port)", addr)
		}
	}
	return nil
}

// providerNames are the providers' names in messages and logs.
var providerNames = map[pluginv1.Provider]string{
	pluginv1.Provider_PROVIDER_IPMITOOL: "ipmitool",
	pluginv1.Provider_PROVIDER_REDFISH:  "redfish",
}

// where names provider p on t for messages: "ipmitool (port 623)".
func (t *target) where(p pluginv1.Provider) string {
	port := t.ipmiPort
	if p == pluginv1.Provider_PROVIDER_REDFISH {
		port = t.rfPort
	}
	return fmt.Sprintf("%s (port %d)", providerNames[p], port)
}
