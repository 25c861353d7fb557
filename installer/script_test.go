package installer

import (
	"encoding/base64"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/installer/manifest"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// release makes a signed manifest of a dist with bcd and bcx-ipmi for
// amd64 and arm64, and returns it with its signature and pin.
func release(t *testing.T, version string, ttl time.Duration) (doc, sig []byte, pin string) {
	t.Helper()
	dist := t.TempDir()
	for _, p := range []string{"bcd_linux_amd64_v1/bcd", "bcd_linux_arm64_v8.0/bcd", "bcx-ipmi_linux_amd64_v1/bcx-ipmi", "bcx-ipmi_linux_arm64_v8.0/bcx-ipmi"} {
		f := filepath.Join(dist, p)
		os.MkdirAll(filepath.Dir(f), 0o755)
		os.WriteFile(f, []byte(p), 0o755)
	}
	m, err := manifest.Build(dist, manifest.BuildOptions{Version: version, Now: now, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	doc, _ = m.Marshal()
	_, priv, pin, err := manifest.GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	sk, _ := manifest.ParsePrivateKey(priv, "")
	sig, err = manifest.Sign(doc, sk, now)
	if err != nil {
		t.Fatal(err)
	}
	return doc, sig, pin
}

func baseOptions() Options {
	return Options{Pool: "pool_abc", Site: "site_xyz", GatewayURL: "https://gw.eu-1.example.com:8443",
		BaseURL: "https://compute.example.com", Version: "0.1.0", Now: now}
}

func TestGenerateShellcheck(t *testing.T) {
	t.Parallel()
	doc, sig, pin := release(t, "0.1.0", 0)
	variants := map[string]Options{}
	variants["unpinned"] = baseOptions()
	o := baseOptions()
	o.Manifest, o.Signature, o.Pins, o.Plugins, o.Unprivileged = doc, sig, []string{pin}, []string{"bcx-ipmi"}, true
	variants["pinned-unprivileged-ipmi"] = o
	o = baseOptions()
	o.BaseURL = "http://10.0.0.5:3000/prefix"
	o.Manifest, o.Signature, o.Pins, o.AllowHTTP = doc, sig, []string{pin}, true
	variants["pinned-http"] = o
	o = baseOptions()
	o.Pool, o.Site, o.PinnedPubKey = "", "", testPubKeyPin
	variants["token-decides-pinned-key"] = o
	for name, opts := range variants {
		script, err := Generate(opts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		path := filepath.Join(t.TempDir(), "install.sh")
		if err := os.WriteFile(path, script, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, sh := range []string{"dash", "bash"} {
			if out, err := exec.Command(sh, "-n", path).CombinedOutput(); err != nil {
				t.Errorf("%s: %s -n: %v\n%s", name, sh, err, out)
			}
		}
		if _, err := exec.LookPath("shellcheck"); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("shellcheck is not installed (apt-get install shellcheck)")
			}
			t.Log("shellcheck is not installed; skipping lint")
			continue
		}
		if out, err := exec.Command("shellcheck", "-s", "sh", path).CombinedOutput(); err != nil {
			t.Errorf("%s: shellcheck: %v\n%s", name, err, out)
		}
	}
}

func TestGeneratePins(t *testing.T) {
	t.Parallel()
	doc, sig, pin := release(t, "0.1.0", 0)
	o := baseOptions()
	o.Manifest, o.Signature, o.Pins, o.Plugins = doc, sig, []string{pin}, []string{"bcx-ipmi"}
	script, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := manifest.Parse(doc)
	for _, prog := range []string{"bcd", "bcx-ipmi"} {
		for _, arch := range Arches {
			a, _ := m.Find(manifest.KindBinary, prog, "linux", arch)
			if !strings.Contains(string(script), "'"+prog+"/"+arch+"') echo '"+a.SHA256+"'") {
				t.Errorf("script does not pin %s/%s", prog, arch)
			}
		}
	}
	for _, want := range []string{"PINNED=1", "DOWNLOADS_URL='https://compute.example.com/api/downloads'", "RELEASE_PINS='" + pin + "'", "HTTPS_ONLY=1"} {
		if !strings.Contains(string(script), want) {
			t.Errorf("script lacks %s", want)
		}
	}
}

func TestGenerateRefuses(t *testing.T) {
	t.Parallel()
	doc, sig, pin := release(t, "0.1.0", 0)
	_, otherSig, otherPin := release(t, "0.1.0", 0)
	expDoc, expSig, expPin := release(t, "0.1.0", time.Hour)
	noArm := func() Options { // a manifest without bcx-ipmi
		o := baseOptions()
		o.Manifest, o.Signature, o.Pins, o.Plugins = doc, sig, []string{pin}, []string{"bcx-ipmi"}
		return o
	}
	_ = noArm
	cases := []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"bad pinned key", func(o *Options) { o.PinnedPubKey = "sha256/" + testPubKeyPin[8:] }, "--pinned-pubkey"},
		{"short pinned key", func(o *Options) { o.PinnedPubKey = "sha256//AAAA" }, "44 characters"},
		{"pinned key over http", func(o *Options) {
			o.BaseURL, o.PinnedPubKey, o.Manifest, o.Signature, o.Pins = "http://127.0.0.1:3000", testPubKeyPin, doc, sig, []string{pin}
		}, "needs an https:// URL"},
		{"http off loopback, pinned", func(o *Options) {
			o.BaseURL, o.Manifest, o.Signature, o.Pins = "http://10.0.0.5:3000", doc, sig, []string{pin}
		}, "--allow-plain-http"},
		{"http named like loopback", func(o *Options) {
			o.BaseURL, o.Manifest, o.Signature, o.Pins = "http://127.0.0.1.example.com", doc, sig, []string{pin}
		}, "not loopback"},
		{"allowed http unpinned", func(o *Options) { o.BaseURL, o.AllowHTTP = "http://10.0.0.5:3000", true }, "needs --release-manifest"},
		{"allow http with https", func(o *Options) { o.AllowHTTP = true }, "nothing to allow"},
		{"shell in pool", func(o *Options) { o.Pool = "p'; rm -rf /; '" }, "--pool"},
		{"newline in site", func(o *Options) { o.Site = "a\nb" }, "--site"},
		{"http gateway", func(o *Options) { o.GatewayURL = "http://gw:8443" }, "https"},
		{"gateway path", func(o *Options) { o.GatewayURL = "https://gw:8443/x" }, "no path"},
		{"gateway user", func(o *Options) { o.GatewayURL = "https://u:p@gw:8443" }, "credentials"},
		{"bad port", func(o *Options) { o.GatewayURL = "https://gw:99999" }, ""},
		{"no base", func(o *Options) { o.BaseURL = "" }, "--base-url is required"},
		{"base query", func(o *Options) { o.BaseURL = "https://c.example.com/?x=$(id)" }, "query"},
		{"base ftp", func(o *Options) { o.BaseURL = "ftp://c.example.com" }, "https"},
		{"base quote", func(o *Options) { o.BaseURL = "https://c.example.com/a'b" }, "path"},
		{"http unpinned", func(o *Options) { o.BaseURL = "http://c.example.com" }, "not loopback"},
		{"http loopback unpinned", func(o *Options) { o.BaseURL = "http://127.0.0.1:3000" }, "must be https"},
		{"no version", func(o *Options) { o.Version = "" }, "--bcd-version is required"},
		{"v version", func(o *Options) { o.Version = "v0.1.0" }, "--bcd-version"},
		{"unknown plugin", func(o *Options) { o.Plugins = []string{"bcx-nope"} }, "known plugins"},
		{"manifest without pins", func(o *Options) { o.Manifest, o.Signature = doc, sig }, "needs --release-pins"},
		{"pins without manifest", func(o *Options) { o.Pins = []string{pin} }, "needs --release-manifest"},
		{"no signature", func(o *Options) { o.Manifest, o.Pins = doc, []string{pin} }, "signature"},
		{"bad pin", func(o *Options) { o.Manifest, o.Signature, o.Pins = doc, sig, []string{"sha256/xx"} }, "invalid release pin"},
		{"unpinned key", func(o *Options) { o.Manifest, o.Signature, o.Pins = doc, sig, []string{otherPin} }, "not pinned"},
		{"other signature", func(o *Options) { o.Manifest, o.Signature, o.Pins = doc, otherSig, []string{pin} }, "not pinned"},
		{"expired", func(o *Options) {
			o.Manifest, o.Signature, o.Pins, o.Now = expDoc, expSig, []string{expPin}, now.Add(2*time.Hour)
		}, "expired"},
		{"other version", func(o *Options) { o.Manifest, o.Signature, o.Pins, o.Version = doc, sig, []string{pin}, "0.2.0" }, "not --bcd-version 0.2.0"},
	}
	for _, c := range cases {
		o := baseOptions()
		c.mutate(&o)
		_, err := Generate(o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error is not one line: %q", c.name, err)
		}
	}
}

// testPubKeyPin is a well-formed curl public key pin.
const testPubKeyPin = "sha256//47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="

func TestGenerateOptionalPoolAndPinnedKey(t *testing.T) {
	t.Parallel()
	o := baseOptions()
	o.Pool, o.Site, o.PinnedPubKey = "", "", testPubKeyPin
	script, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"#   pool and site: the join token decides", "PINNED_PUBKEY='" + testPubKeyPin + "'",
		"--pinnedpubkey \"$PINNED_PUBKEY\"", "POOL=''"} {
		if !strings.Contains(string(script), want) {
			t.Errorf("script lacks %s", want)
		}
	}
	o = baseOptions()
	script, err = Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "#   pool pool_abc, site site_xyz (as asked; the join token decides") {
		t.Errorf("header:\n%s", script[:600])
	}
}

func TestIsLoopbackHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{"localhost": true, "127.0.0.1": true, "127.9.8.7": true, "::1": true,
		"10.0.0.1": false, "127.0.0.1.example.com": false, "localhost.example.com": false, "128.0.0.1": false,
		"::ffff:127.0.0.1": false, "0:0:0:0:0:0:0:1": false, "": false} {
		if got := IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v", host, got)
		}
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "a", "it's", "'", `"$(id)"`, "a b\tc"} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("shellQuote(%q) -> %q (%v)", s, out, err)
		}
	}
}

// functions writes the script without its last line (the call of main), so
// that a shell can source it and call one function.
func functions(t *testing.T, script []byte) string {
	t.Helper()
	s := strings.TrimSuffix(string(script), "\n")
	last := s[strings.LastIndexByte(s, '\n')+1:]
	if last != `main "$@" --end-of-install-script` {
		t.Fatalf("the script's last line is %q", last)
	}
	p := filepath.Join(t.TempDir(), "functions.sh")
	if err := os.WriteFile(p, []byte(s[:len(s)-len(last)]), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// shell runs body under dash after sourcing the script's functions and
// settings, with env as the whole environment (and PATH).
func shell(t *testing.T, funcs string, env []string, body string) (string, error) {
	t.Helper()
	cmd := exec.Command("dash", "-c", ". \"$0\"; set -eu; settings; "+body, funcs)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestScriptIsOneFunctionCall(t *testing.T) {
	t.Parallel()
	script, err := Generate(baseOptions())
	if err != nil {
		t.Fatal(err)
	}
	// Every line outside a function is blank, a comment, the start of a
	// function definition, or the call on the last line.
	lines := strings.Split(strings.TrimSuffix(string(script), "\n"), "\n")
	depth, heredoc := 0, ""
	for i, l := range lines {
		switch {
		case heredoc != "":
			if l == heredoc {
				heredoc = ""
			}
			continue
		case strings.Contains(l, "<<'"):
			heredoc = l[strings.Index(l, "<<'")+3:]
			heredoc = heredoc[:strings.IndexByte(heredoc, '\'')]
		}
		if depth == 0 && i < len(lines)-1 && l != "" && !strings.HasPrefix(l, "#") && !regexp.MustCompile(`^[a-z_0-9]+\(\) \{`).MatchString(l) {
			t.Errorf("line %d runs outside a function: %q", i+1, l)
		}
		if regexp.MustCompile(`^[a-z_0-9]+\(\) \{$`).MatchString(l) {
			depth++
		} else if l == "}" {
			depth--
		}
	}
	if depth != 0 {
		t.Errorf("unbalanced functions: depth %d at the end", depth)
	}
	// A cut inside the last line calls main without the end marker, or
	// with a piece of it: main refuses before it looks at anything else.
	funcs := functions(t, script)
	call := `main "$@" --end-of-install-script`
	for i := len("main"); i < len(call); i++ {
		prefix := call[:i]
		if strings.Count(prefix, `"`)%2 == 1 {
			continue // a syntax error: sh runs nothing
		}
		for _, args := range []string{"", "--dry-run", "--token-file x"} {
			cmd := exec.Command("dash", "-c", ". \"$0\"; "+prefix, funcs)
			cmd.Args = append(cmd.Args, strings.Fields(args)...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "BCD_ROOT=" + t.TempDir(), "BCD_JOIN_TOKEN=x"}
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "this script is incomplete") {
				t.Errorf("last line cut to %q (args %q): %v\n%s", prefix, args, err, out)
			}
		}
	}
}

func TestScriptIsLoopback(t *testing.T) {
	t.Parallel()
	script, err := Generate(baseOptions())
	if err != nil {
		t.Fatal(err)
	}
	funcs := functions(t, script)
	for _, host := range []string{"localhost", "127.0.0.1", "127.9.8.7", "::1", "10.0.0.1", "127.0.0.1.example.com",
		"localhost.example.com", "128.0.0.1", "::ffff:127.0.0.1", "example.com"} {
		_, err := shell(t, funcs, nil, "is_loopback "+shellQuote(host))
		if got := err == nil; got != IsLoopbackHost(host) {
			t.Errorf("script is_loopback %q = %v, IsLoopbackHost says %v", host, got, !got)
		}
	}
	for url, host := range map[string]string{"http://10.0.0.5:3000/api/downloads": "10.0.0.5", "http://[::1]:3000/x": "::1",
		"https://u@h.example.com/x": "h.example.com", "http://localhost": "localhost"} {
		out, err := shell(t, funcs, nil, "url_host "+shellQuote(url))
		if err != nil || strings.TrimSpace(out) != host {
			t.Errorf("url_host %s = %q (%v), want %s", url, out, err, host)
		}
	}
}

// TestScriptRefusesPlainHTTP: a script whose downloads URL is plain HTTP
// off loopback (as an edited one would be) refuses before anything else,
// and a generated --allow-plain-http one warns.
func TestScriptRefusesPlainHTTP(t *testing.T) {
	t.Parallel()
	doc, sig, pin := release(t, "0.1.0", 0)
	o := baseOptions()
	o.BaseURL = "http://127.0.0.1:3000"
	o.Manifest, o.Signature, o.Pins = doc, sig, []string{pin}
	script, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(script), "http://127.0.0.1:3000/api/downloads", "http://10.0.0.5:3000/api/downloads", -1)
	out, err := shell(t, functions(t, []byte(edited)), nil, "check_transport")
	if err == nil || !strings.Contains(out, "refusing to download over plain HTTP from 10.0.0.5, which is not loopback") {
		t.Errorf("check_transport: %v\n%s", err, out)
	}
	o.BaseURL, o.AllowHTTP = "http://10.0.0.5:3000", true
	script, err = Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	out, err = shell(t, functions(t, script), nil, "check_transport")
	if err != nil || !strings.Contains(out, "WARNING: downloading from 10.0.0.5 over plain HTTP") {
		t.Errorf("check_transport with --allow-plain-http: %v\n%s", err, out)
	}
}

func TestScriptProxyFor(t *testing.T) {
	t.Parallel()
	script, err := Generate(baseOptions())
	if err != nil {
		t.Fatal(err)
	}
	funcs := functions(t, script)
	const https, http = "https://compute.example.com/api/downloads/bcd", "http://127.0.0.1:3000/api/downloads/bcd"
	cases := []struct {
		fetch, url string
		env        []string
		want       string
	}{
		{"curl", https, nil, ""},
		{"curl", https, []string{"https_proxy=http://p:3128"}, "http://p:3128 (https_proxy)"},
		{"curl", https, []string{"HTTPS_PROXY=http://P:3128"}, "http://P:3128 (HTTPS_PROXY)"},
		{"curl", https, []string{"https_proxy=http://a:1", "HTTPS_PROXY=http://b:1"}, "http://a:1 (https_proxy)"},
		{"curl", https, []string{"ALL_PROXY=socks5://s:1080"}, "socks5://s:1080 (ALL_PROXY)"},
		{"curl", https, []string{"all_proxy=socks5://s:1080", "https_proxy=http://p:1"}, "http://p:1 (https_proxy)"},
		{"curl", https, []string{"http_proxy=http://p:1"}, ""},
		{"curl", http, []string{"http_proxy=http://p:1"}, "http://p:1 (http_proxy)"},
		{"curl", http, []string{"HTTP_PROXY=http://p:1"}, ""}, // curl ignores it (httpoxy)
		{"curl", http, []string{"HTTPS_PROXY=http://p:1"}, ""},
		{"curl", https, []string{"https_proxy=http://user:secret@p:3128"}, "http://***@p:3128 (https_proxy)"},
		{"curl", https, []string{"https_proxy=http://p:1", "NO_PROXY=example.com"}, ""},
		{"curl", https, []string{"https_proxy=http://p:1", "no_proxy=.example.com"}, ""},
		{"curl", https, []string{"https_proxy=http://p:1", "no_proxy=other.com, compute.example.com"}, ""},
		{"curl", https, []string{"https_proxy=http://p:1", "no_proxy=*"}, ""},
		{"curl", https, []string{"https_proxy=http://p:1", "no_proxy=ample.com"}, "http://p:1 (https_proxy)"},
		{"curl", https, []string{"https_proxy=http://p:1", "no_proxy=other.com", "NO_PROXY=example.com"}, "http://p:1 (https_proxy)"},
		{"curl", http, []string{"http_proxy=http://p:1", "NO_PROXY=127.0.0.1"}, ""},
		{"wget", https, []string{"HTTPS_PROXY=http://p:1"}, ""},
		{"wget", https, []string{"ALL_PROXY=http://p:1"}, ""},
		{"wget", https, []string{"https_proxy=http://p:1"}, "http://p:1 (https_proxy)"},
		{"wget", https, []string{"https_proxy=http://p:1", "NO_PROXY=example.com"}, "http://p:1 (https_proxy)"},
		{"wget", https, []string{"https_proxy=http://p:1", "no_proxy=example.com"}, ""},
	}
	for _, c := range cases {
		out, err := shell(t, funcs, c.env, "FETCH="+c.fetch+"; proxy_for "+shellQuote(c.url))
		if err != nil || strings.TrimSpace(out) != c.want {
			t.Errorf("%s %s %v: proxy_for = %q (%v), want %q", c.fetch, c.url, c.env, out, err, c.want)
		}
	}
}

// TestScriptPinnedPubKey downloads from a real TLS server with the script's
// fetch: the right pin passes curl -k, a wrong one fails even with -k, and
// without curl the script refuses.
func TestScriptPinnedPubKey(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is not installed")
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "payload") }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // curl hangs up on a wrong pin
	srv.StartTLS()
	t.Cleanup(srv.Close)
	right := PubKeyPin(srv.Certificate())
	wrong := "sha256//" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	for _, c := range []struct {
		pin  string
		want string // "" for success
	}{
		{right, ""},
		{wrong, "cannot download bcd from " + srv.URL + "/f: the server's TLS key is not the one this script pins, " + wrong},
	} {
		o := baseOptions()
		o.PinnedPubKey = c.pin
		script, err := Generate(o)
		if err != nil {
			t.Fatal(err)
		}
		tmp := t.TempDir()
		out, err := shell(t, functions(t, script), nil, "FETCH=curl; TMP="+shellQuote(tmp)+"; fetch_or_die bcd "+shellQuote(srv.URL+"/f")+" \"$TMP/f\"; cat \"$TMP/f\"")
		if c.want == "" {
			if err != nil || out != "payload" {
				t.Errorf("right pin: %v\n%s", err, out)
			}
		} else if err == nil || !strings.Contains(out, c.want) || !strings.Contains(out, "curl: (90)") {
			t.Errorf("wrong pin: %v\n%s", err, out)
		}
	}
	// Without a pin, curl checks the CA: the test server's is not trusted.
	script, err := Generate(baseOptions())
	if err != nil {
		t.Fatal(err)
	}
	out, err := shell(t, functions(t, script), nil, "FETCH=curl; TMP="+shellQuote(t.TempDir())+"; fetch_or_die bcd "+shellQuote(srv.URL+"/f")+" \"$TMP/f\"")
	if err == nil || !strings.Contains(out, "curl: (60)") {
		t.Errorf("no pin, untrusted CA: %v\n%s", err, out)
	}

	// With a pin and no curl (a PATH of only dash and wget), check_system refuses.
	o := baseOptions()
	o.PinnedPubKey = right
	script, err = Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for _, tool := range []string{"uname", "wget", "id"} {
		if p, err := exec.LookPath(tool); err == nil {
			os.Symlink(p, filepath.Join(bin, tool))
		}
	}
	dash, _ := exec.LookPath("dash")
	cmd := exec.Command(dash, "-c", ". \"$0\"; settings; check_system", functions(t, script))
	cmd.Env = []string{"PATH=" + bin, "BCD_ROOT=" + t.TempDir()}
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "only curl can check, and curl is not installed") {
		t.Errorf("pinned key without curl: %v\n%s", err, b)
	}
}

// TestScriptProxyFailure: a download through a dead proxy names the proxy.
func TestScriptProxyFailure(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "payload") }))
	t.Cleanup(srv.Close)
	doc, sig, pin := release(t, "0.1.0", 0)
	o := baseOptions()
	o.BaseURL, o.Manifest, o.Signature, o.Pins = srv.URL, doc, sig, []string{pin}
	script, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	funcs := functions(t, script)
	for _, fetch := range []string{"curl", "wget"} {
		if _, err := exec.LookPath(fetch); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed", fetch)
			}
			continue
		}
		body := "FETCH=" + fetch + "; TMP=" + shellQuote(t.TempDir()) + "; fetch_or_die bcd " + shellQuote(srv.URL+"/f") + " \"$TMP/f\"; cat \"$TMP/f\""
		out, err := shell(t, funcs, []string{"http_proxy=" + dead}, body)
		want := "install-bcd: error: cannot download bcd from " + srv.URL + "/f through the proxy " + dead + " (http_proxy): "
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("%s through a dead proxy: %v\n%s\nwant %q", fetch, err, out, want)
		}
		if fetch == "curl" && !strings.Contains(out, "curl: (7)") {
			t.Errorf("curl's own error is missing:\n%s", out)
		}
		// no_proxy takes the server off the proxy: the download works.
		out, err = shell(t, funcs, []string{"http_proxy=" + dead, "no_proxy=127.0.0.1"}, body)
		if err != nil || out != "payload" {
			t.Errorf("%s with no_proxy: %v\n%s", fetch, err, out)
		}
	}
}
