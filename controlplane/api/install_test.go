package api_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// releases is a downloads folder holding the versions it lists and no
// signed manifest.
type releases []string

func (r releases) Versions(string) []string { return r }
func (r releases) Manifest(string) ([]byte, []byte, error) {
	return nil, nil, errors.New("no signed release manifest")
}

// addFixture is an API made with cfg over a store with a PKI bundle, a
// site s holding pool p and a site t holding pool q.
func addFixture(t *testing.T, cfg api.Config) (*fixture, *pki.Bundle) {
	t.Helper()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	cfg.Secret = strings.Repeat("s", 32)
	f := &fixture{t: t, st: st, srv: api.New(cfg, st, nil)}
	f.admin = f.token(store.RoleAdmin, 0)
	b, err := pki.Init(pki.InitOptions{TrustDomain: "add.test"})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := b.SealBundle(cfg.Secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: "add.test", Sealed: sealed}); err != nil {
		t.Fatal(err)
	}
	for site, pool := range map[string]string{"s": "p", "t": "q"} {
		s, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: site, Region: "r"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: pool, SiteID: s.ID}); err != nil {
			t.Fatal(err)
		}
	}
	return f, b
}

func TestNodesAddRefusals(t *testing.T) {
	t.Parallel()
	f, _ := addFixture(t, api.Config{GatewayURL: "https://localhost:8443", Releases: releases{"0.1.0"}})
	for _, tc := range []struct {
		body, field string
	}{
		{`{}`, "pool"},
		{`{"pool":"p","ttl":"59s"}`, "ttl"},
		{`{"pool":"p","ttl":"0s"}`, "ttl"},
		{`{"pool":"p","ttl":"2592001s"}`, "ttl"},
		{`{"pool":"p","site":"t"}`, "site"},
		{`{"pool":"p","plugins":["bcx-nope"]}`, "plugins"},
	} {
		t.Run(tc.body, func(t *testing.T) {
			wantCode(t, f.call("nodes.add", f.admin, tc.body, peer), http.StatusBadRequest, apiv1.CodeInvalidArgument, tc.field)
		})
	}
	wantCode(t, f.call("nodes.add", f.admin, `{"pool":"nosuchpool"}`, peer), http.StatusNotFound, apiv1.CodeNotFound, "pool")
	wantCode(t, f.call("nodes.add", f.admin, `{"pool":"p","site":"nosuchsite"}`, peer), http.StatusNotFound, apiv1.CodeNotFound, "site")
	for _, role := range []string{store.RoleViewer, store.RoleOperator} {
		wantCode(t, f.call("nodes.add", f.token(role, 0), `{"pool":"p"}`, peer), http.StatusForbidden, apiv1.CodePermissionDenied, "")
	}

	// Plain HTTP on a host other machines reach: the token would cross the
	// network in clear text.
	plain, _ := addFixture(t, api.Config{PublicURL: "http://compute.example.com:3000", GatewayURL: "https://compute.example.com:8443",
		Releases: releases{"0.1.0"}})
	r := plain.call("nodes.add", plain.admin, `{"pool":"p"}`, peer)
	wantCode(t, r, http.StatusServiceUnavailable, apiv1.CodeUnavailable, "")
	if msg := r.Body["message"].(string); !strings.Contains(msg, "--api-tls auto") || !strings.Contains(msg, "clear text") {
		t.Errorf("message %q does not say what to do", msg)
	}
	// No bcd to install: the line would fail on the new machine.
	empty, _ := addFixture(t, api.Config{GatewayURL: "https://localhost:8443", Releases: releases{}})
	wantCode(t, empty.call("nodes.add", empty.admin, `{"pool":"p"}`, peer), http.StatusNotFound, apiv1.CodeNotFound, "")
	off, _ := addFixture(t, api.Config{GatewayURL: "https://localhost:8443"})
	wantCode(t, off.call("nodes.add", off.admin, `{"pool":"p"}`, peer), http.StatusServiceUnavailable, apiv1.CodeUnavailable, "")

	for _, g := range []*fixture{f, plain, empty, off} {
		if toks, err := g.st.JoinTokenList(context.Background(), &store.ListParams{}); err != nil || len(toks) != 0 {
			t.Fatalf("refused calls made tokens: %v %v", toks, err)
		}
	}
}

// TestNodesAddOverHTTPS runs the API with a certificate from the gateway
// serving CA and checks the line nodes.add returns: the pin is the served
// key's, the script URL answers the script, and the token is in the
// environment of sh only.
func TestNodesAddOverHTTPS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := api.Config{Listen: "127.0.0.1:0", PublicHost: "127.0.0.1", GatewayURL: "https://gw.example.com:8443",
		Releases: releases{"0.2.0", "0.1.0"}, TLSCertFile: filepath.Join(dir, bootstrap.APICertFile), TLSKeyFile: filepath.Join(dir, bootstrap.APIKeyFile)}
	f, b := addFixture(t, cfg)
	if _, _, _, err := bootstrap.EnsureServingCert(b, dir, bootstrap.APICertFile, bootstrap.APIKeyFile, bootstrap.LocalNames(nil)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	<-f.srv.Ready()
	base := f.srv.PublicURL()
	if !strings.HasPrefix(base, "https://127.0.0.1:") {
		t.Fatalf("public URL %s", base)
	}
	roots := x509.NewCertPool()
	roots.AddCert(b.GatewayCA.Cert)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	c := &client.Client{BaseURL: base + "/api", Token: f.admin, HTTP: hc}
	resp := &apiv1.AddNodeResponse{}
	if err := c.Call(ctx, "nodes.add", &apiv1.AddNodeRequest{Pool: "p", Unprivileged: true, Plugins: []string{"bcx-ipmi"}}, resp); err != nil {
		t.Fatal(err)
	}
	if resp.Pool != "p" || resp.Token == "" || resp.JoinTokenId == "" {
		t.Fatalf("response %v", resp)
	}
	if left := time.Until(resp.ExpiresAt.AsTime()); left < 59*time.Minute || left > time.Hour {
		t.Errorf("expires in %v, want the default 1h", left)
	}
	wantURL := base + "/api/install.sh?plugins=bcx-ipmi&unprivileged=1"
	if resp.ScriptUrl != wantURL {
		t.Errorf("script URL %s, want %s", resp.ScriptUrl, wantURL)
	}
	if strings.Contains(resp.ScriptUrl, resp.Token) {
		t.Error("the token is in the URL")
	}
	// The pin is the key the API serves.
	conn, err := tls.Dial("tcp", strings.TrimPrefix(base, "https://"), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	served := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	if resp.Pin != api.SPKIPin(served) || !strings.HasPrefix(resp.Pin, "sha256//") || len(resp.Pin) != len("sha256//")+44 {
		t.Fatalf("pin %s, served key %s", resp.Pin, api.SPKIPin(served))
	}
	want := "curl -fsS -k --pinnedpubkey '" + resp.Pin + "' -o install-bcd.sh '" + wantURL + "' && BCD_JOIN_TOKEN='" + resp.Token + "' sh install-bcd.sh"
	if resp.InstallCommand != want {
		t.Errorf("install command\n%s\nwant\n%s", resp.InstallCommand, want)
	}
	toks, err := f.st.JoinTokenList(ctx, &store.ListParams{})
	if err != nil || len(toks) != 1 || toks[0].MaxUses != 1 {
		t.Fatalf("tokens %v %v, want one of one use", toks, err)
	}

	// The script route: public, the newest version, the options of the query.
	res, err := hc.Get(resp.ScriptUrl)
	if err != nil {
		t.Fatal(err)
	}
	script, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(script), "0.2.0") || !strings.Contains(string(script), resp.Pin) ||
		!strings.Contains(string(script), "https://gw.example.com:8443") || !strings.Contains(string(script), "bcx-ipmi") {
		t.Fatalf("install.sh: %d\n%.2000s", res.StatusCode, script)
	}
	if strings.Contains(string(script), resp.Token) {
		t.Fatal("the script holds the token")
	}
	for q, status := range map[string]int{"?version=0.1.0": 200, "?version=0.3.0": 404, "?version=v1": 400, "?plugins=nope": 400, "?color=red": 400} {
		res, err := hc.Get(base + "/api/install.sh" + q)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != status {
			t.Errorf("install.sh%s: %d, want %d", q, res.StatusCode, status)
		}
	}
}

// TestInstallScriptWebSocketTransport: ?transport=websocket (nodes.add
// websocket) joins through host.gateway.ws.publicURL; asked for while the
// fallback is off, or with another transport, it is INVALID_ARGUMENT.
func TestInstallScriptWebSocketTransport(t *testing.T) {
	t.Parallel()
	const wsURL = "wss://proxy.example/v1/session"
	get := func(f *fixture, query string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/api/install.sh"+query, nil)
		w := httptest.NewRecorder()
		f.srv.Handler().ServeHTTP(w, r)
		return w
	}
	on, _ := addFixture(t, api.Config{PublicURL: "https://compute.example.com", GatewayURL: "https://localhost:8443", WebSocketURL: wsURL,
		Releases: releases{"0.1.0"}})
	if w := get(on, "?transport=websocket"); w.Code != 200 || !strings.Contains(w.Body.String(), "GATEWAY_URL='"+wsURL+"'") {
		t.Fatalf("install.sh?transport=websocket: %d, no GATEWAY_URL %s in\n%.400s", w.Code, wsURL, w.Body.String())
	}
	if w := get(on, ""); w.Code != 200 || !strings.Contains(w.Body.String(), "GATEWAY_URL='https://localhost:8443'") {
		t.Fatalf("install.sh: %d, not the direct gateway", w.Code)
	}
	r := on.call("nodes.add", on.admin, `{"pool":"p","websocket":true}`, peer)
	if script, _ := r.Body["scriptUrl"].(string); r.Code != 200 || !strings.HasSuffix(script, "?transport=websocket") {
		t.Fatalf("nodes.add websocket = %v", r)
	}
	off, _ := addFixture(t, api.Config{PublicURL: "https://compute.example.com", GatewayURL: "https://localhost:8443", Releases: releases{"0.1.0"}})
	for f, query := range map[*fixture]string{off: "?transport=websocket", on: "?transport=carrier-pigeon"} {
		if w := get(f, query); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"field":"transport"`) {
			t.Errorf("install.sh%s: %d %s", query, w.Code, w.Body.String())
		}
	}
	wantCode(t, off.call("nodes.add", off.admin, `{"pool":"p","websocket":true}`, peer), http.StatusBadRequest, apiv1.CodeInvalidArgument, "transport")
}
