package bmc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/proto/bmcsecret"
)

// DefaultFile is where the BMC file is read unless configured otherwise.
const DefaultFile = "/etc/bcd/bmc.yaml"

// DefaultPlugin is the BMC plugin used when the file names none: bcx-ipmi.
const DefaultPlugin = "ipmi"

// quoted matches a value yaml.v3 quotes in an error.
var quoted = regexp.MustCompile("`[^`]*`")

// maxFileSize bounds the BMC file.
const maxFileSize = 1 << 20

// ErrNoFile reports that the BMC file does not exist.
var ErrNoFile = errors.New("no BMC file")

// File is the content of the BMC file (see the package documentation).
type File struct {
	// Plugin is the BMC plugin's name (bcx-<Plugin>). Defaults to
	// DefaultPlugin.
	Plugin string `yaml:"plugin"`
	// BMC is the machine's own BMC, if the file gives it.
	BMC *Target `yaml:"bmc"`
	// BMCs are the named BMCs of machines without a daemon.
	BMCs []Target `yaml:"bmcs"`
}

// Target is one BMC and how to reach it.
type Target struct {
	// Name names an entry of File.BMCs; empty for File.BMC.
	Name string `yaml:"name"`
	// Address is the BMC's host name or IP address, without port or scheme.
	Address string `yaml:"address"`
	// Username is the BMC account.
	Username string `yaml:"username"`
	// Password is the account's password. Secret.
	Password string `yaml:"password"`
	// Providers are "ipmitool" and "redfish", tried in this order. Empty
	// means both, in that order.
	Providers []string `yaml:"providers"`
	// Timeout bounds each call, all providers together. Zero means 30 s.
	Timeout time.Duration `yaml:"timeout"`
	// IPMIPort is the UDP port of IPMI over LAN; 0 means 623.
	IPMIPort uint32 `yaml:"ipmiPort"`
	// IPMICipherSuite is ipmitool's -C; empty means "3".
	IPMICipherSuite string `yaml:"ipmiCipherSuite"`
	// RedfishPort is the HTTPS port of Redfish; 0 means 443.
	RedfishPort uint32 `yaml:"redfishPort"`
	// RedfishCAFile holds the PEM certificates the Redfish service's
	// certificate must chain to; empty means it is not verified.
	RedfishCAFile string `yaml:"redfishCAFile"`
}

// String describes t without its password.
func (t Target) String() string {
	if t.Name != "" {
		return fmt.Sprintf("bmc %s (%s)", t.Name, t.Address)
	}
	return "bmc " + t.Address
}

// GoString is String, so %#v does not print the password either.
func (t Target) GoString() string { return t.String() }

// credentials returns t in the sealed secret's form, for validation.
func (t *Target) credentials() *bmcsecret.Credentials {
	c := &bmcsecret.Credentials{Address: t.Address, Username: t.Username, Password: t.Password,
		Providers: t.Providers, IPMIPort: t.IPMIPort, RedfishPort: t.RedfishPort, IPMICipherSuite: t.IPMICipherSuite}
	if t.Timeout != 0 {
		c.Timeout = t.Timeout.String()
	}
	return c
}

// fromCredentials makes a Target of sealed credentials.
func fromCredentials(c *bmcsecret.Credentials) (*Target, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	d, _ := c.TimeoutDuration()
	return &Target{Address: c.Address, Username: c.Username, Password: c.Password, Providers: c.Providers,
		Timeout: d, IPMIPort: c.IPMIPort, RedfishPort: c.RedfishPort, IPMICipherSuite: c.IPMICipherSuite}, nil
}

// ReadFile reads and checks the BMC file at path. It fails with an error
// wrapping ErrNoFile when there is none, and refuses a file that is not a
// regular file, that is owned by another user than root or the running one,
// or that group or others may read or write. Errors never quote a password.
func ReadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist", ErrNoFile, path)
	}
	if err != nil {
		return nil, fmt.Errorf("read BMC file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read BMC file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("BMC file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("BMC file %s has mode %#o: it holds passwords, so only its owner may read it (chmod 0600 %s)", path, perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("BMC file %s is owned by uid %d: it must belong to root (chown root:root %s)", path, st.Uid, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read BMC file: %w", err)
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("BMC file %s is over %d bytes", path, maxFileSize)
	}
	return ParseFile(path, b)
}

// ParseFile parses and validates the content b of the BMC file path (named in
// errors).
func ParseFile(path string, b []byte) (*File, error) {
	var file File
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil && !errors.Is(err, io.EOF) {
		// yaml.v3 quotes the offending value between backquotes ("cannot
		// unmarshal !!str `...` into uint32"): a password written in the
		// wrong place must not reach a log through that.
		return nil, fmt.Errorf("BMC file %s: %s", path, quoted.ReplaceAllString(err.Error(), "`...`"))
	}
	if file.Plugin == "" {
		file.Plugin = DefaultPlugin
	}
	if err := file.validate(); err != nil {
		return nil, fmt.Errorf("BMC file %s: %w", path, err)
	}
	return &file, nil
}

func (f *File) validate() error {
	if !validName(f.Plugin) {
		return fmt.Errorf("plugin %q: want the name of a bcx-<name> plugin", f.Plugin)
	}
	if f.BMC != nil {
		if f.BMC.Name != "" {
			return errors.New("bmc: the machine's own BMC takes no name")
		}
		if err := f.BMC.validate(); err != nil {
			return fmt.Errorf("bmc: %w", err)
		}
	}
	seen := map[string]bool{}
	for i := range f.BMCs {
		t := &f.BMCs[i]
		if !validName(t.Name) {
			return fmt.Errorf("bmcs[%d]: name %q: want 1 to 63 of A-Z, a-z, 0-9, '.', '-', '_'", i, t.Name)
		}
		if seen[t.Name] {
			return fmt.Errorf("bmcs[%d]: name %q given twice", i, t.Name)
		}
		seen[t.Name] = true
		if err := t.validate(); err != nil {
			return fmt.Errorf("bmcs[%d] (%s): %w", i, t.Name, err)
		}
	}
	return nil
}

func (t *Target) validate() error {
	if t.Timeout < 0 {
		return errors.New("timeout must not be negative")
	}
	return t.credentials().Validate()
}

// lookup returns the entry called name.
func (f *File) lookup(name string) (*Target, error) {
	for i := range f.BMCs {
		if f.BMCs[i].Name == name {
			return &f.BMCs[i], nil
		}
	}
	names := make([]string, 0, len(f.BMCs))
	for _, t := range f.BMCs {
		names = append(names, t.Name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return nil, fmt.Errorf("no BMC named %q: the BMC file lists none (bmcs)", name)
	}
	return nil, fmt.Errorf("no BMC named %q in the BMC file (it lists %s)", name, strings.Join(names, ", "))
}

// ValidName reports whether s is a valid BMC or plugin name: 1 to 63 of
// A-Z, a-z, 0-9, '.', '-' and '_'.
func ValidName(s string) bool { return validName(s) }

func validName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}
