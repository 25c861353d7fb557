// Package bmcsecret defines the sealed secret that carries a node's BMC
// credentials, shared by the control plane, which writes it
// (bmc.setCredentials), and bcd, which fetches it through
// JoinService.Secret to power its own machine on and off.
//
// The secret is named "bmc/<node id>" (Name) and granted to that node only.
// Its value is one JSON object (Marshal, Parse):
//
//	{"address": "10.1.2.3", "username": "admin", "password": "...",
//	 "providers": ["ipmitool", "redfish"], "timeout": "30s",
//	 "ipmiPort": 623, "redfishPort": 443, "ipmiCipherSuite": "3"}
//
// address, username and password are required; the rest take bcx-ipmi's
// defaults when absent. The control plane keeps it sealed under the
// deployment secret and opens it only to answer the node's Secret call, over
// mutual TLS.
package bmcsecret

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"
)

// Prefix starts the name of every BMC credentials secret.
const Prefix = "bmc/"

// Limits of the fields, checked by Validate.
const (
	MaxPassword = 256
	MaxUsername = 128
	MaxTimeout  = 10 * time.Minute
)

// Providers a credential may name, in bcx-ipmi's words.
const (
	ProviderIPMITool = "ipmitool"
	ProviderRedfish  = "redfish"
)

// Name returns the name of the secret holding nodeID's BMC credentials.
func Name(nodeID string) string { return Prefix + nodeID }

// Credentials are how to reach one BMC. Password is a secret: String,
// GoString and LogValue leave it out, so a Credentials printed or logged by
// mistake does not leak it; only Marshal writes it.
type Credentials struct {
	// Address is the BMC's host name or IP address, without port or scheme.
	Address string `json:"address"`
	// Username is the BMC account.
	Username string `json:"username"`
	// Password is the account's password.
	Password string `json:"password"`
	// Providers are tried in this order: "ipmitool", "redfish". Empty means
	// both, in that order.
	Providers []string `json:"providers,omitempty"`
	// Timeout bounds each call, as a Go duration ("30s"). Empty means 30 s.
	Timeout string `json:"timeout,omitempty"`
	// IPMIPort is the UDP port of IPMI over LAN; 0 means 623.
	IPMIPort uint32 `json:"ipmiPort,omitempty"`
	// RedfishPort is the HTTPS port of Redfish; 0 means 443.
	RedfishPort uint32 `json:"redfishPort,omitempty"`
	// IPMICipherSuite is ipmitool's -C; empty means "3".
	IPMICipherSuite string `json:"ipmiCipherSuite,omitempty"`
}

// ErrInvalid is wrapped by every error of Validate and Parse.
var ErrInvalid = errors.New("invalid BMC credentials")

// Validate checks c: the required fields, the providers, the timeout and
// the address (no scheme, port or white space). Its errors never hold the
// password.
func (c *Credentials) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if err := CheckAddress(c.Address); err != nil {
		return bad("address: %v", err)
	}
	if c.Username == "" || len(c.Username) > MaxUsername || strings.ContainsAny(c.Username, "\x00\r\n") {
		return bad("username: 1 to %d bytes, one line", MaxUsername)
	}
	if c.Password == "" || len(c.Password) > MaxPassword || strings.ContainsAny(c.Password, "\x00\r\n") {
		return bad("password: 1 to %d bytes, one line", MaxPassword)
	}
	seen := map[string]bool{}
	for _, p := range c.Providers {
		if p != ProviderIPMITool && p != ProviderRedfish {
			return bad("provider %q: want %s or %s", p, ProviderIPMITool, ProviderRedfish)
		}
		if seen[p] {
			return bad("provider %q given twice", p)
		}
		seen[p] = true
	}
	if _, err := c.TimeoutDuration(); err != nil {
		return bad("%v", err)
	}
	if len(c.IPMICipherSuite) > 2 || strings.Trim(c.IPMICipherSuite, "0123456789") != "" {
		return bad("ipmiCipherSuite %q: want a number such as 3 or 17", c.IPMICipherSuite)
	}
	if c.IPMIPort > 65535 || c.RedfishPort > 65535 {
		return bad("ports are 1 to 65535")
	}
	return nil
}

// TimeoutDuration returns Timeout parsed; zero when unset.
func (c *Credentials) TimeoutDuration() (time.Duration, error) {
	if c.Timeout == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(c.Timeout)
	if err != nil || d < 0 || d > MaxTimeout {
		return 0, fmt.Errorf("timeout %q: want a duration up to %v", c.Timeout, MaxTimeout)
	}
	return d, nil
}

// CheckAddress checks a BMC address: a host name or IP address without
// scheme, port, path or white space.
func CheckAddress(a string) error {
	switch {
	case a == "":
		return errors.New("required")
	case len(a) > 253:
		return errors.New("longer than 253 bytes")
	case strings.Contains(a, "://"):
		return fmt.Errorf("%q: give the host alone, without a scheme", a)
	case strings.ContainsAny(a, " \t\r\n/\\@"):
		return fmt.Errorf("%q: not a host name or IP address", a)
	}
	if net.ParseIP(a) != nil {
		return nil
	}
	if strings.Contains(a, ":") {
		return fmt.Errorf("%q: give the host alone, without a port (set the port fields)", a)
	}
	return nil
}

// Marshal returns the secret's value: c as JSON, password included.
func (c *Credentials) Marshal() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(c)
}

// Parse reads a secret's value and validates it. Its errors never hold the
// value.
func Parse(value []byte) (*Credentials, error) {
	var c Credentials
	dec := json.NewDecoder(strings.NewReader(string(value)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: the secret is not a JSON credentials object", ErrInvalid)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// String describes c without its password.
func (c Credentials) String() string {
	return fmt.Sprintf("bmc %s user %s (password %s)", c.Address, c.Username, redacted(c.Password))
}

// GoString is String, so %#v does not print the password either.
func (c Credentials) GoString() string { return c.String() }

// LogValue logs c without its password.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(slog.String("address", c.Address), slog.String("username", c.Username))
}

func redacted(p string) string {
	if p == "" {
		return "unset"
	}
	return "[REDACTED]"
}
