package api

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/installer"
	"github.com/better-compute/better-compute/installer/manifest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// InstallScriptPath is the install script's route under basePath: GET
// {basePath}/install.sh.
const InstallScriptPath = "/install.sh"

// Releases is what the install script route reads from the downloads
// folder (package downloads implements it).
type Releases interface {
	// Versions lists the versions of artifact present for Linux, newest
	// first.
	Versions(artifact string) []string
	// Manifest returns the release manifest of version and its signature;
	// an error when the folder holds no signed manifest for it.
	Manifest(version string) (m, sig []byte, err error)
}

// scriptOptions are the install script's choices a caller makes.
type scriptOptions struct {
	version      string // "" for the newest in the downloads folder
	unprivileged bool
	plugins      []string
	websocket    bool // join through the WebSocket fallback (host.gateway.ws.publicURL)
}

// query is the script URL's query for o.
func (o scriptOptions) query() string {
	q := url.Values{}
	if o.version != "" {
		q.Set("version", o.version)
	}
	if o.unprivileged {
		q.Set("unprivileged", "1")
	}
	if len(o.plugins) > 0 {
		q.Set("plugins", strings.Join(o.plugins, ","))
	}
	if o.websocket {
		q.Set("transport", "websocket")
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// parseScriptQuery reads ?version=&unprivileged=&plugins=&transport= of
// GET install.sh; a bad value is INVALID_ARGUMENT naming the parameter.
func parseScriptQuery(q url.Values) (scriptOptions, error) {
	var o scriptOptions
	for k := range q {
		if k != "version" && k != "unprivileged" && k != "plugins" && k != "transport" {
			return o, invalid(k, "unknown parameter (want version, unprivileged, plugins, transport)")
		}
	}
	switch v := q.Get("transport"); v {
	case "", "direct":
	case "websocket":
		o.websocket = true
	default:
		return o, invalid("transport", "want direct or websocket")
	}
	if v := q.Get("version"); v != "" {
		if !manifest.ValidVersion(v) {
			return o, invalid("version", "want a release version like 0.1.0")
		}
		o.version = v
	}
	if v := q.Get("unprivileged"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return o, invalid("unprivileged", "want 1 or 0")
		}
		o.unprivileged = b
	}
	if v := q.Get("plugins"); v != "" {
		o.plugins = strings.Split(v, ",")
	}
	if err := checkPlugins(o.plugins); err != nil {
		return o, err
	}
	return o, nil
}

func checkPlugins(plugins []string) error {
	for _, p := range plugins {
		if !slices.Contains(installer.Plugins, p) {
			return invalid("plugins", "unknown plugin %q (known: %s)", p, strings.Join(installer.Plugins, ", "))
		}
	}
	return nil
}

// PublicURL is the API's origin as other machines reach it: Config.PublicURL,
// else the public host on the bound port.
func (s *Server) PublicURL() string {
	if s.cfg.PublicURL != "" {
		return s.cfg.PublicURL
	}
	scheme, port := "http", "3000"
	if s.certs != nil {
		scheme = "https"
	}
	if a, ok := s.addr.(*net.TCPAddr); ok {
		port = strconv.Itoa(a.Port)
	}
	host := s.cfg.PublicHost
	if host == "" {
		host = "localhost"
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// Pin is the API serving certificate's public key pin in curl's
// --pinnedpubkey form, "sha256//" and the standard base64 of the sha256 of
// its SubjectPublicKeyInfo; "" when the API serves plain HTTP.
func (s *Server) Pin() string {
	if s.certs == nil {
		return ""
	}
	c := s.certs.Current()
	if c == nil || len(c.Certificate) == 0 {
		return ""
	}
	leaf := c.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return ""
		}
	}
	return SPKIPin(leaf)
}

// SPKIPin is cert's public key pin in curl's --pinnedpubkey form:
// "sha256//BASE64" of the sha256 of its SubjectPublicKeyInfo.
func SPKIPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256//" + base64.StdEncoding.EncodeToString(sum[:])
}

// gatewayURL is the gateway URL the install script joins through:
// Config.GatewayURL, else the first live gateway.
func (s *Server) gatewayURL(ctx context.Context) (string, error) {
	if s.cfg.GatewayURL != "" {
		return s.cfg.GatewayURL, nil
	}
	gws, err := s.store.GatewayList(ctx)
	if err != nil {
		return "", err
	}
	for _, g := range gws {
		if time.Since(g.HeartbeatAt) < 20*time.Second && !g.Draining && g.Address != "" {
			return g.Address, nil
		}
	}
	return "", &Error{Code: apiv1.CodeUnavailable, Message: "no live gateway to join through: start the gateway role, or set host.gateway.publicURL"}
}

// installScript generates the install script for o from the
// configuration: the gateway's public URL, the API's public URL and pin,
// the newest bcd in the downloads folder (or o.version), and the signed
// manifest of that release pinned by downloads.releasePins when the folder
// holds one. Missing releases are NOT_FOUND; a configuration the script
// cannot be made from is UNAVAILABLE with the generator's reason.
func (s *Server) installScript(ctx context.Context, o scriptOptions) ([]byte, error) {
	if s.cfg.Releases == nil {
		return nil, &Error{Code: apiv1.CodeUnavailable, Message: "the downloads route is off, so the install script has no bcd to install: set downloads.dir (" + config.EnvDownloadsDir + ") to a folder holding bcd (docs/install.md)"}
	}
	version := o.version
	versions := s.cfg.Releases.Versions("bcd")
	switch {
	case version == "" && len(versions) == 0:
		return nil, notFound("the downloads folder holds no bcd for Linux: put a release there (docs/install.md, \"A second machine\")")
	case version == "":
		version = versions[0]
	case !slices.Contains(versions, version):
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "version", Message: fmt.Sprintf("bcd %s for Linux is not in the downloads folder (it holds %s)", version, orNone(versions))}
	}
	gw, err := s.gatewayURL(ctx)
	if err != nil {
		return nil, err
	}
	if o.websocket {
		if s.cfg.WebSocketURL == "" {
			return nil, invalid("transport", "the WebSocket fallback is off: set host.gateway.ws.publicURL (docs/websocket.md)")
		}
		gw = s.cfg.WebSocketURL
	}
	opts := installer.Options{GatewayURL: gw, BaseURL: s.PublicURL(), BasePath: s.cfg.BasePath, Version: version,
		PinnedPubKey: s.Pin(), Unprivileged: o.unprivileged, Plugins: o.plugins}
	if len(s.cfg.ReleasePins) > 0 {
		// The pins in force: a machine installed after release pins add
		// pins the new key from the start.
		pins, _, err := s.pinsInForce(ctx)
		if err != nil {
			return nil, err
		}
		m, sig, err := s.cfg.Releases.Manifest(version)
		if err == nil {
			opts.Manifest, opts.Signature, opts.Pins = m, sig, pins
		} else {
			s.log.WarnContext(ctx, "Install script without a pinned release manifest", "version", version, logkey.Err, err)
		}
	}
	script, err := installer.Generate(opts)
	if err != nil {
		return nil, &Error{Code: apiv1.CodeUnavailable, Message: "cannot make the install script from this configuration: " + err.Error()}
	}
	return script, nil
}

func orNone(vs []string) string {
	if len(vs) == 0 {
		return "none"
	}
	return strings.Join(vs, ", ")
}

// badQueryParam names the first parameter of rawQuery that does not parse
// (a ";" separator or a bad escape), for the refusal's field.
func badQueryParam(rawQuery string) string {
	for pair := range strings.SplitSeq(rawQuery, "&") {
		k, _, _ := strings.Cut(pair, "=")
		if _, err := url.ParseQuery(pair); err != nil || strings.Contains(pair, ";") {
			if uk, err := url.QueryUnescape(k); err == nil && !strings.Contains(uk, ";") {
				return uk
			}
			return "query"
		}
	}
	return "query"
}

// serveInstallScript answers GET {basePath}/install.sh. It is public: the
// script holds no secret (the join token comes from the machine's
// environment, BCD_JOIN_TOKEN).
func (s *Server) serveInstallScript(w http.ResponseWriter, r *http.Request) {
	// ParseQuery, not URL.Query: Query drops a pair it cannot parse (a raw
	// ";" in "unprivileged=';id;'"), which would answer the defaults.
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		s.writeError(w, r, invalid(badQueryParam(r.URL.RawQuery), "malformed query: %v", err))
		return
	}
	o, err := parseScriptQuery(q)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	script, err := s.installScript(r.Context(), o)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/x-shellscript; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(len(script)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(script)
}

// nodesAdd makes a one-use join token for a pool and the line that
// installs and joins a new machine with it (DESIGN.md, "Installer").
func (s *Server) nodesAdd(ctx context.Context, p *iam.Principal, r *apiv1.AddNodeRequest) (*apiv1.AddNodeResponse, error) {
	pool, err := s.pool(ctx, p, "pool", r.GetPool())
	if err != nil {
		return nil, err
	}
	if r.GetSite() != "" {
		if err := id("site", r.GetSite()); err != nil {
			return nil, err
		}
		site, err := s.store.SiteGet(ctx, r.GetSite())
		if err != nil {
			return nil, fieldNotFound(err, "site", "no site "+r.GetSite())
		}
		if site.ID != pool.SiteID {
			return nil, invalid("site", "pool %s is not in site %s", pool.Name, site.Name)
		}
	}
	ttl := apiv1.DefaultAddNodeTTL
	if r.GetTtl() != nil {
		if ttl, err = joinTokenTTL(r.GetTtl()); err != nil {
			return nil, err
		}
	}
	if err := checkPlugins(r.GetPlugins()); err != nil {
		return nil, err
	}
	base := s.PublicURL()
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("the API's public URL %q: %w", base, err)
	}
	if u.Scheme != "https" && !config.IsLoopbackHost(u.Hostname()) {
		return nil, &Error{Code: apiv1.CodeUnavailable, Message: fmt.Sprintf("the API's public URL %s is plain HTTP on a host other machines reach: the token and the install script would cross the network in clear text; serve the API over HTTPS (serve --api-tls auto, or --api-tls files with --api-tls-cert and --api-tls-key; docs/configuration.md)", base)}
	}
	o := scriptOptions{unprivileged: r.GetUnprivileged(), plugins: slices.Compact(slices.Sorted(slices.Values(r.GetPlugins()))),
		websocket: r.GetWebsocket()}
	// Make the script once first: a configuration it cannot be made from
	// fails here, before a token exists.
	if _, err := s.installScript(ctx, o); err != nil {
		return nil, err
	}
	gwPins, err := s.gatewayPins(ctx)
	if err != nil {
		return nil, err
	}
	secret, rec, err := CreateJoinTokenPins(ctx, s.store, gwPins, pool.ID, ttl, 1, "nodes add", "")
	if err != nil {
		return nil, err
	}
	scriptURL := base + s.cfg.BasePath + InstallScriptPath + o.query()
	pin := s.Pin()
	return &apiv1.AddNodeResponse{JoinTokenId: rec.ID, Token: secret, ExpiresAt: timestamppb.New(rec.ExpiresAt), Pool: pool.Name,
		InstallCommand: InstallCommand(scriptURL, pin, secret), ScriptUrl: scriptURL, Pin: pin}, nil
}

// InstallScriptFile is the file the pasted line saves the script in, in
// the current directory.
const InstallScriptFile = "install-bcd.sh"

// InstallCommand is the line to paste on a new machine, as root: curl
// fetches scriptURL into InstallScriptFile, pinned to pin when it is set
// (-k then skips only the CA check, which the pin replaces: a certificate
// with another key is refused), and only when the whole script arrived
// (curl exits 0) sh runs it with the token in BCD_JOIN_TOKEN. The line's
// exit status is curl's on a failed download (90: not the pinned key; 7: no
// connection) and the script's otherwise; a pipe into sh would hide curl's
// failure behind sh's 0. Each value is single-quoted for sh.
func InstallCommand(scriptURL, pin, token string) string {
	curl := "curl -fsS"
	if pin != "" {
		curl += " -k --pinnedpubkey " + shellQuote(pin)
	}
	return curl + " -o " + InstallScriptFile + " " + shellQuote(scriptURL) + " && BCD_JOIN_TOKEN=" + shellQuote(token) + " sh " + InstallScriptFile
}

// shellQuote quotes v for POSIX sh.
func shellQuote(v string) string {
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// LocalURL is where a CLI on this machine reaches the API: the bound
// address, a wildcard one as 127.0.0.1 (::1 only for a listen address of
// [::]), and https when the API serves TLS. Valid after Ready.
func (s *Server) LocalURL() string {
	scheme := "http"
	if s.certs != nil {
		scheme = "https"
	}
	a, ok := s.addr.(*net.TCPAddr)
	if !ok {
		return scheme + "://127.0.0.1:3000"
	}
	ip := a.IP
	if ip == nil || ip.IsUnspecified() {
		// Go reports a wildcard listener as [::] even for 0.0.0.0 (a
		// dual-stack socket), and ::1 does not exist where IPv6 is off:
		// loopback is 127.0.0.1 unless the listen address itself was an
		// IPv6 wildcard.
		ip = net.IPv4(127, 0, 0, 1)
		if host, _, err := net.SplitHostPort(s.cfg.Listen); err == nil {
			if l := net.ParseIP(host); l != nil && l.To4() == nil {
				ip = net.IPv6loopback
			}
		}
	}
	return scheme + "://" + net.JoinHostPort(ip.String(), strconv.Itoa(a.Port))
}
