package installer

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/better-compute/better-compute/installer/manifest"
)

//go:embed install.sh.tmpl
var scriptText string

var scriptTemplate = template.Must(template.New("install.sh").Option("missingkey=error").
	Funcs(template.FuncMap{"q": shellQuote}).Parse(scriptText))

// Plugins are the plugins the script can install with bcd.
var Plugins = []string{"bcx-ipmi"}

// Arches are the Linux architectures the script installs on.
var Arches = []string{"amd64", "arm64"}

// Options are the install script's settings; Generate checks every one.
type Options struct {
	// Pool and Site name where the machine is meant to join (ids like
	// pool_..., or names): letters, digits, '.', '_' and '-', at most 128.
	// Both are optional: the join token decides where the machine joins,
	// and the script prints the pool and site it actually joined. They are
	// written into the script's header and prompt only as the intent.
	Pool, Site string
	// GatewayURL is the gateway bcd joins through: https://host[:port], or
	// wss://host[:port]/v1/session for the WebSocket fallback.
	GatewayURL string
	// BaseURL is the control plane's origin (https://compute.example.com);
	// the script downloads from BaseURL + BasePath + "/downloads/...". It
	// must be https unless a release manifest pins the digests.
	BaseURL string
	// PinnedPubKey pins the server's TLS key in curl's form
	// "sha256//BASE64" (the standard base64 of the sha256 of the server
	// certificate's SubjectPublicKeyInfo, 44 characters). When set, every
	// download the script makes uses curl -k --pinnedpubkey PIN: the key
	// alone is trusted, not the system's CAs, so a self-signed control
	// plane works and a proxy or impostor that re-signs is refused. wget
	// cannot pin, so such a script requires curl. Needs an https BaseURL.
	PinnedPubKey string
	// AllowHTTP lets BaseURL be plain http:// on a host that is not
	// loopback (127.0.0.0/8, ::1, localhost), which is refused otherwise;
	// it also needs a release manifest (Manifest, Signature, Pins), whose
	// pinned sha256 are then the only protection of the binaries. The join
	// script never sends the join token there: bcd joins the gateway over
	// TLS.
	AllowHTTP bool
	// BasePath is the API's base path. Defaults to /api.
	BasePath string
	// Version is the bcd release to install (0.1.0).
	Version string
	// Manifest and Signature are a release manifest and its minisign
	// signature; with Pins they pin every binary's sha256 in the script.
	// All three or none.
	Manifest, Signature []byte
	// Pins are the trusted release key pins (sha256/...).
	Pins []string
	// Plugins lists plugins to install beside bcd (bcx-ipmi).
	Plugins []string
	// Unprivileged runs bcd as the user bcd beside the root helper.
	Unprivileged bool
	// Now is the time the manifest's expiry is checked against. Defaults to
	// time.Now.
	Now time.Time
}

var (
	nameRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	basePathRE = regexp.MustCompile(`^(/[A-Za-z0-9._~-]+)*$`)
	hostRE     = regexp.MustCompile(`^[A-Za-z0-9.-]+$|^\[[0-9A-Fa-f:.]+\]$`)
)

// scriptData is what the template renders.
type scriptData struct {
	Version, Pool, Site, GatewayURL, DownloadsURL string
	GeneratedAt                                   string
	Unprivileged, Pinned, HTTPSOnly, AllowHTTP    bool
	PinnedPubKey                                  string
	Plugins                                       string
	ManifestSHA256                                string
	PinsList                                      string
	Digests                                       []digest
	AgentUnit, HelperUnit                         string
}

type digest struct{ Program, Arch, SHA256 string }

// Generate checks opts and returns the install script. With a release
// manifest it verifies the manifest's signature against the pins (and its
// expiry at opts.Now), checks that it is the release asked for, and pins
// the sha256 of bcd and of each plugin for every Linux architecture the
// release has. Errors name the option at fault.
func Generate(opts Options) ([]byte, error) {
	d, err := check(&opts)
	if err != nil {
		return nil, err
	}
	units, err := Units(UnitOptions{BinDir: "/usr/local/bin", Unprivileged: opts.Unprivileged})
	if err != nil {
		return nil, err
	}
	d.AgentUnit = string(units["bcd.service"])
	d.HelperUnit = string(units["bcd-helper.service"])
	for name, u := range units {
		// The script writes each unit from a here-document ended by this line.
		if strings.Contains("\n"+string(u), "\nUNIT_EOF\n") {
			return nil, fmt.Errorf("render install script: %s holds the line UNIT_EOF", name)
		}
	}
	var b bytes.Buffer
	if err := scriptTemplate.Execute(&b, d); err != nil {
		return nil, fmt.Errorf("render install script: %w", err)
	}
	return b.Bytes(), nil
}

func check(opts *Options) (*scriptData, error) {
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if opts.BasePath == "" {
		opts.BasePath = "/api"
	}
	for _, f := range []struct{ flag, v string }{{"--pool", opts.Pool}, {"--site", opts.Site}} {
		if f.v != "" && !nameRE.MatchString(f.v) {
			return nil, fmt.Errorf("%s %q: use letters, digits, '.', '_' and '-' (at most 128)", f.flag, f.v)
		}
	}
	// The WebSocket fallback's wss URL is checked as the https origin it
	// names, plus its one path.
	wsGateway, gwRaw := false, opts.GatewayURL
	if rest, ok := strings.CutPrefix(gwRaw, "wss://"); ok {
		wsGateway, gwRaw = true, "https://"+rest
	}
	gw, err := checkURL("--gateway-url", gwRaw, true)
	if err != nil {
		return nil, err
	}
	if wsGateway {
		gw.Scheme = "wss"
	}
	switch {
	case gw.Scheme == "wss" && gw.Path != "/v1/session":
		return nil, fmt.Errorf("--gateway-url %q: the WebSocket fallback is wss://host[:port]/v1/session", opts.GatewayURL)
	case gw.Scheme == "wss":
		// The WebSocket fallback, for a site whose proxy strips client
		// certificates (docs/install.md).
	case gw.Scheme != "https":
		return nil, fmt.Errorf("--gateway-url %q: the gateway speaks TLS only: use https://host[:port] (or wss://host[:port]/v1/session for the WebSocket fallback)", opts.GatewayURL)
	case gw.Path != "" && gw.Path != "/":
		return nil, fmt.Errorf("--gateway-url %q: give no path, only https://host[:port]", opts.GatewayURL)
	}
	base, err := checkURL("--base-url", opts.BaseURL, true)
	if err != nil {
		return nil, err
	}
	if !basePathRE.MatchString(opts.BasePath) {
		return nil, fmt.Errorf("--base-path %q: want an absolute path like /api", opts.BasePath)
	}
	if opts.Version == "" {
		return nil, errors.New("--bcd-version is required")
	}
	if !manifest.ValidVersion(opts.Version) {
		return nil, fmt.Errorf("--bcd-version %q: want a release version like 0.1.0 (no leading v)", opts.Version)
	}
	for _, p := range opts.Plugins {
		if !slices.Contains(Plugins, p) {
			return nil, fmt.Errorf("--install-plugins %q: known plugins are %s", p, strings.Join(Plugins, ", "))
		}
	}
	plugins := slices.Compact(slices.Sorted(slices.Values(opts.Plugins)))
	if opts.PinnedPubKey != "" {
		if err := CheckPinnedPubKey(opts.PinnedPubKey); err != nil {
			return nil, err
		}
		if base.Scheme != "https" {
			return nil, fmt.Errorf("--base-url %q: a pinned TLS key needs an https:// URL", opts.BaseURL)
		}
	}
	if base.Scheme == "http" && !IsLoopbackHost(base.Hostname()) {
		if !opts.AllowHTTP {
			return nil, fmt.Errorf("--base-url %q: plain HTTP to a host that is not loopback (127.0.0.0/8, ::1, localhost) lets anyone on the way read and swap the script's downloads: use https:// (with --pinned-pubkey for a self-signed server), or, with a signed release manifest, pass --allow-plain-http", opts.BaseURL)
		}
		if opts.Manifest == nil {
			return nil, fmt.Errorf("--allow-plain-http with --base-url %q needs --release-manifest and --release-pins: over plain HTTP only the manifest's sha256 protect the binaries", opts.BaseURL)
		}
	} else if opts.AllowHTTP {
		return nil, fmt.Errorf("--allow-plain-http: --base-url %q is not plain HTTP to a host that is not loopback, so there is nothing to allow", opts.BaseURL)
	}

	d := &scriptData{
		Version: opts.Version, Pool: opts.Pool, Site: opts.Site,
		GatewayURL:   strings.TrimSuffix(gw.String(), "/"),
		DownloadsURL: strings.TrimSuffix(base.String(), "/") + opts.BasePath + "/downloads",
		GeneratedAt:  opts.Now.UTC().Format(time.RFC3339),
		Unprivileged: opts.Unprivileged,
		HTTPSOnly:    base.Scheme == "https",
		AllowHTTP:    opts.AllowHTTP,
		PinnedPubKey: opts.PinnedPubKey,
		Plugins:      strings.Join(plugins, " "),
	}

	haveManifest, haveSig, havePins := opts.Manifest != nil, opts.Signature != nil, len(opts.Pins) > 0
	switch {
	case !haveManifest && !havePins:
		if base.Scheme != "https" {
			return nil, fmt.Errorf("--base-url %q: without --release-manifest and --release-pins the script trusts the server through TLS alone, so it must be https", opts.BaseURL)
		}
		return d, nil
	case !havePins:
		return nil, errors.New("--release-manifest needs --release-pins: the pins of the keys trusted to sign releases")
	case !haveManifest:
		return nil, errors.New("--release-pins needs --release-manifest: the signed manifest of the release to install")
	case !haveSig:
		return nil, errors.New("--release-manifest needs its signature (the .minisig file beside it, or --release-signature)")
	}
	for _, p := range opts.Pins {
		if _, err := manifest.ParsePin(p); err != nil {
			return nil, fmt.Errorf("--release-pins: %w", err)
		}
	}
	m, err := manifest.Verify(opts.Manifest, opts.Signature, opts.Pins, opts.Now)
	if err != nil {
		if errors.Is(err, manifest.ErrExpired) {
			return nil, fmt.Errorf("--release-manifest: %w: sign a fresh manifest to install this release", err)
		}
		return nil, fmt.Errorf("--release-manifest: %w", err)
	}
	if m.Version != opts.Version {
		return nil, fmt.Errorf("--release-manifest is for version %s, not --bcd-version %s", m.Version, opts.Version)
	}
	for _, prog := range append([]string{"bcd"}, plugins...) {
		found := false
		for _, arch := range Arches {
			if a, ok := m.Find(manifest.KindBinary, prog, "linux", arch); ok {
				d.Digests = append(d.Digests, digest{Program: prog, Arch: arch, SHA256: a.SHA256})
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("--release-manifest lists no Linux binary of %s (kind binary, os linux, arch %s)", prog, strings.Join(Arches, " or "))
		}
	}
	sum := sha256.Sum256(opts.Manifest)
	d.Pinned = true
	d.ManifestSHA256 = hex.EncodeToString(sum[:])
	d.PinsList = strings.Join(slices.Compact(slices.Sorted(slices.Values(opts.Pins))), " ")
	return d, nil
}

// pubKeyPinPrefix starts curl's --pinnedpubkey hash form.
const pubKeyPinPrefix = "sha256//"

// CheckPinnedPubKey checks a TLS key pin in curl's --pinnedpubkey form:
// "sha256//" and the standard base64 (44 characters) of the SHA-256 of the
// server certificate's DER SubjectPublicKeyInfo.
func CheckPinnedPubKey(pin string) error {
	b64, ok := strings.CutPrefix(pin, pubKeyPinPrefix)
	if !ok {
		return fmt.Errorf("--pinned-pubkey %q: want sha256// and the base64 of the SHA-256 of the server's SubjectPublicKeyInfo (curl's --pinnedpubkey form)", pin)
	}
	sum, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil || len(sum) != sha256.Size {
		return fmt.Errorf("--pinned-pubkey %q: want sha256// and 44 characters of standard base64 (a SHA-256)", pin)
	}
	return nil
}

// PubKeyPin returns curl's --pinnedpubkey pin of a certificate's public
// key: "sha256//" and the standard base64 of the SHA-256 of its DER
// SubjectPublicKeyInfo.
func PubKeyPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return pubKeyPinPrefix + base64.StdEncoding.EncodeToString(sum[:])
}

// IsLoopbackHost reports whether host (a URL's host name, without brackets
// or port) is localhost, an IPv4 address in 127.0.0.0/8 or ::1: the hosts
// the install script downloads from over plain HTTP without
// Options.AllowHTTP. The script applies the same rule to the text.
func IsLoopbackHost(host string) bool {
	if host == "localhost" || host == "::1" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.To4() != nil && ip.String() == host && ip.IsLoopback()
}

// checkURL parses an http(s) origin: a host, an optional port, no user,
// query or fragment, and (unless allowPath) no path.
func checkURL(flag, raw string, allowPath bool) (*url.URL, error) {
	if raw == "" {
		return nil, fmt.Errorf("%s is required", flag)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %v", flag, raw, err)
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, fmt.Errorf("%s %q: want an https:// URL", flag, raw)
	case u.Host == "" || !hostRE.MatchString(u.Hostname()) && !hostRE.MatchString("["+u.Hostname()+"]"):
		return nil, fmt.Errorf("%s %q: no valid host", flag, raw)
	case u.User != nil:
		return nil, fmt.Errorf("%s %q: credentials do not belong in the URL", flag, raw)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, fmt.Errorf("%s %q: no query or fragment", flag, raw)
	case u.Opaque != "":
		return nil, fmt.Errorf("%s %q: want scheme://host[:port]", flag, raw)
	case !allowPath && u.Path != "" && u.Path != "/":
		return nil, fmt.Errorf("%s %q: give no path", flag, raw)
	case allowPath && !basePathRE.MatchString(strings.TrimSuffix(u.Path, "/")):
		return nil, fmt.Errorf("%s %q: the path may hold only letters, digits and . _ ~ -", flag, raw)
	}
	if p := u.Port(); p != "" {
		var n int
		if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 || fmt.Sprint(n) != p {
			return nil, fmt.Errorf("%s %q: invalid port", flag, raw)
		}
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(u.Path, "/")}, nil
}

// shellQuote quotes s for POSIX sh: in single quotes, each single quote
// inside closed, escaped with a backslash and reopened.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
