package doctor_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/better-compute/better-compute/bcd/doctor"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	"github.com/better-compute/better-compute/proto/jointoken"
)

func want(t *testing.T, r doctor.Result, id string, st doctor.Status, hint string) {
	t.Helper()
	if r.ID != id || r.Status != st || !strings.Contains(r.Hint, hint) {
		t.Fatalf("got %s [%s] %s %q (detail %q); want %s %s with %q", r.ID, r.Target, r.Status, r.Hint, r.Detail, id, st, hint)
	}
}

func find(t *testing.T, rep *doctor.Report, id string) doctor.Result {
	t.Helper()
	for _, r := range rep.Checks {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("no %s check in %+v", id, rep.Checks)
	return doctor.Result{}
}

// joined joins a node to a fresh sessiontest gateway and saves its
// identity; it returns the data directory, the gateway and the identity.
func joined(t *testing.T, opts sessiontest.GatewayOptions) (string, *sessiontest.Gateway, *identity.Identity) {
	t.Helper()
	p := sessiontest.NewPKI(t)
	gw := sessiontest.NewGateway(t, p, opts)
	tok := p.NewToken(t)
	gw.AddToken(tok)
	key := sessiontest.NewKey(t)
	res, err := session.Join(context.Background(), session.JoinParams{GatewayURL: gw.URL, Token: tok, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	id := identity.FromJoin(res, key, nil, time.Now())
	dir := t.TempDir()
	if err := identity.NewStore(dir).Save(id); err != nil {
		t.Fatal(err)
	}
	return dir, gw, id
}

// noDriver is NVML on a host without the NVIDIA driver.
type noDriver struct{ nvml.Interface }

func (noDriver) Init() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }

func TestRunJoinedNode(t *testing.T) {
	t.Parallel()
	dir, gw, id := joined(t, sessiontest.GatewayOptions{CertTTL: 24 * time.Hour})
	plugins := t.TempDir()
	writePlugin(t, plugins, "bcx-ipmi", "#!/bin/sh\necho 'bcx-ipmi 0.3.1'\n", 0o755)
	rep := doctor.Run(context.Background(), doctor.Config{DataDir: dir, NVML: dgxa100.New(), PluginDir: plugins,
		HelperSocket: "", Timeout: 5 * time.Second})
	want(t, find(t, rep, doctor.IDIdentity), doctor.IDIdentity, doctor.OK, "node "+id.NodeID)
	want(t, find(t, rep, doctor.IDCertificate), doctor.IDCertificate, doctor.OK, "valid for")
	want(t, find(t, rep, doctor.IDDNS), doctor.IDDNS, doctor.OK, "an IP address")
	want(t, find(t, rep, doctor.IDTCP), doctor.IDTCP, doctor.OK, "connected to 127.0.0.1")
	// The test gateway's certificate lives one day: less than the week
	// doctor wants left.
	tlsRes := find(t, rep, doctor.IDTLS)
	want(t, tlsRes, doctor.IDTLS, doctor.Warn, "the gateway's certificate ends in 24h")
	if tlsRes.Target != gw.URL || !strings.Contains(tlsRes.Detail, "trusted through pin sha256/") {
		t.Fatalf("tls = %+v", tlsRes)
	}
	// The test gateway answers a Challenge with its time.
	clk := find(t, rep, doctor.IDGatewayTime)
	want(t, clk, doctor.IDGatewayTime, doctor.OK, "agrees with the gateway's")
	if !strings.Contains(clk.Detail, "from the gateway's Challenge (server_time)") {
		t.Fatalf("gateway.clock detail %q, want the Challenge's time", clk.Detail)
	}
	want(t, find(t, rep, doctor.IDNVML), doctor.IDNVML, doctor.OK, "NVML sees 8 GPU(s)")
	want(t, find(t, rep, doctor.IDHelper), doctor.IDHelper, doctor.OK, "")
	want(t, find(t, rep, doctor.IDPlugin), doctor.IDPlugin, doctor.OK, "bcx-ipmi 0.3.1")
	find(t, rep, doctor.IDClock) // ok or warn, as this machine's NTP is
	if rep.Count(doctor.Fail) != 0 || rep.Failed(false) {
		t.Fatalf("report: %+v", rep)
	}
}

func TestRunWithoutNetworkOrIdentity(t *testing.T) {
	t.Parallel()
	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + ln.Addr().String()
	ln.Close()
	rep := doctor.Run(context.Background(), doctor.Config{DataDir: t.TempDir(), Gateways: []string{closed, "https://gw.nowhere.invalid"},
		NVML: noDriver{}, PluginDir: filepath.Join(t.TempDir(), "none"), Timeout: 2 * time.Second})
	want(t, rep.Checks[0], doctor.IDIdentity, doctor.Fail, "not joined")
	var tcp, dns doctor.Result
	for _, r := range rep.Checks {
		switch {
		case r.ID == doctor.IDTCP && r.Target == closed:
			tcp = r
		case r.ID == doctor.IDDNS && r.Target == "https://gw.nowhere.invalid":
			dns = r
		}
	}
	want(t, tcp, doctor.IDTCP, doctor.Fail, "cannot connect")
	want(t, dns, doctor.IDDNS, doctor.Fail, "cannot resolve gw.nowhere.invalid")
	want(t, find(t, rep, doctor.IDNVML), doctor.IDNVML, doctor.Warn, "no NVIDIA driver")
	want(t, find(t, rep, doctor.IDPlugins), doctor.IDPlugins, doctor.OK, "no plugin directory")
	if rep.Status != doctor.Fail || !rep.Failed(false) {
		t.Fatalf("report: %+v", rep)
	}
}

func TestCertificate(t *testing.T) {
	t.Parallel()
	_, _, id := joined(t, sessiontest.GatewayOptions{CertTTL: 24 * time.Hour})
	now := time.Now()
	want(t, doctor.Certificate(id, now, 0), doctor.IDCertificate, doctor.OK, "valid for")
	want(t, doctor.Certificate(id, id.RenewAfter.Add(time.Hour), 0), doctor.IDCertificate, doctor.Warn, "renewal overdue by 1h0m0s")
	want(t, doctor.Certificate(id, id.NotAfter().Add(time.Minute), 0), doctor.IDCertificate, doctor.Fail, "expired 1m0s ago: bcd node re-attests it")
	// A short life: the seconds left, not "0s".
	want(t, doctor.Certificate(id, id.NotAfter().Add(-23*time.Second), 0), doctor.IDCertificate, doctor.Warn, "23s left")
	if r := doctor.Certificate(id, now, 0); !strings.Contains(r.Detail, fmt.Sprintf("serial %032x", id.Chain[0].SerialNumber)) {
		t.Errorf("detail %q, want the serial in 32 hex digits", r.Detail)
	}
	want(t, doctor.Certificate(id, id.Chain[0].NotBefore.Add(-time.Hour), 0), doctor.IDCertificate, doctor.Fail, "clock is behind")
	// A node 48 h ahead whose bcd node measured it: judged by the gateway's time.
	want(t, doctor.Certificate(id, now.Add(48*time.Hour), 48*time.Hour), doctor.IDCertificate, doctor.OK, "valid for")

	other := *id
	other.Key = sessiontest.NewKey(t)
	want(t, doctor.Certificate(&other, now, 0), doctor.IDCertificate, doctor.Fail, "not for the node key")
	stranger := *id
	stranger.NodeCARoots = []*x509.Certificate{sessiontest.NewPKI(t).NodeCA}
	want(t, doctor.Certificate(&stranger, now, 0), doctor.IDCertificate, doctor.Fail, "does not chain to the node CA roots")
}

func TestJoinToken(t *testing.T) {
	t.Parallel()
	_, _, id := joined(t, sessiontest.GatewayOptions{})
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A token of this deployment: its pin is the node's.
	p := sessiontest.NewPKI(t)
	same := write("same", strings.Replace(p.NewToken(t), pinPart(p.Pin()), pinPart(id.GatewayPin), 1)+"\n")
	r, pin := doctor.JoinToken(same, id)
	want(t, r, doctor.IDJoinToken, doctor.OK, "known only to the control plane")
	if pin != id.GatewayPin {
		t.Fatalf("pin %q, want %q", pin, id.GatewayPin)
	}
	r, _ = doctor.JoinToken(write("other", p.NewToken(t)), id)
	want(t, r, doctor.IDJoinToken, doctor.Warn, "pins another gateway CA")
	r, _ = doctor.JoinToken(write("junk", "bct1.not-a-token"), nil)
	want(t, r, doctor.IDJoinToken, doctor.Fail, "not a join token")
	if strings.Contains(r.Detail, "not-a-token") {
		t.Fatalf("detail quotes the token: %q", r.Detail)
	}
	r, _ = doctor.JoinToken(filepath.Join(dir, "missing"), nil)
	want(t, r, doctor.IDJoinToken, doctor.Fail, "cannot read")
}

// pinPart is the token form of a pin: the part after "sha256/", as
// unpadded base64url.
func pinPart(pin string) string {
	s := strings.TrimPrefix(pin, "sha256/")
	s = strings.TrimRight(s, "=")
	return strings.NewReplacer("+", "-", "/", "_").Replace(s)
}

func TestTLSTrust(t *testing.T) {
	t.Parallel()
	_, gw, id := joined(t, sessiontest.GatewayOptions{})
	addr := strings.TrimPrefix(gw.URL, "https://")
	check := func(trust session.Trust) doctor.Result {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return doctor.TLS(context.Background(), c, "127.0.0.1", trust, gw.URL, 5*time.Second, time.Now)
	}
	want(t, check(id.Trust()), doctor.IDTLS, doctor.Warn, "ends in 24h")
	// A proxy re-signing the connection, or another deployment: the pin
	// is nowhere in the chain.
	want(t, check(session.Trust{Pin: sessiontest.NewPKI(t).Pin()}), doctor.IDTLS, doctor.Fail, "does not hold the pinned CA")
	want(t, check(session.Trust{}), doctor.IDTLS, doctor.Fail, "no trust anchor")
	// The CA file form of trust.
	pool := x509.NewCertPool()
	for _, c := range gwCAs(t, gw) {
		pool.AddCert(c)
	}
	r := check(session.Trust{Roots: pool})
	want(t, r, doctor.IDTLS, doctor.Warn, "ends in")
	if !strings.Contains(r.Detail, "the CA file") {
		t.Fatalf("detail %q", r.Detail)
	}

	// A gateway certificate with a year left is fine.
	addr2, trust := clockGateway(t, 0)
	c, err := net.Dial("tcp", addr2)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want(t, doctor.TLS(context.Background(), c, "127.0.0.1", trust, "https://"+addr2, 5*time.Second, time.Now), doctor.IDTLS, doctor.OK, "TLS 1.3 handshake")
	want(t, check(session.Trust{Roots: x509.NewCertPool()}), doctor.IDTLS, doctor.Fail, "does not verify")
}

func gwCAs(t *testing.T, gw *sessiontest.Gateway) []*x509.Certificate {
	t.Helper()
	return []*x509.Certificate{gw.PKI.GatewayCA}
}

// testCA makes a gateway serving CA and a certificate for 127.0.0.1
// valid for a year, and returns the certificate and the CA's pin.
func testCA(t *testing.T) (tls.Certificate, string) {
	t.Helper()
	caKey := sessiontest.NewKey(t)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "doctor test CA"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(2 * 365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key := sessiontest.NewKey(t)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "gateway"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(365 * 24 * time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: key}, jointoken.Pin(ca)
}

// clockGateway is a gRPC server with the health service that stamps each
// answer with a Date off by skew, as a gateway would with its own clock.
func clockGateway(t *testing.T, skew time.Duration) (string, session.Trust) {
	t.Helper()
	cert, pin := testCA(t)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}})),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			_ = grpc.SetHeader(ctx, metadata.Pairs("date", time.Now().Add(skew).UTC().Format(http.TimeFormat)))
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), session.Trust{Pin: pin}
}

func TestGatewayClock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		skew time.Duration
		st   doctor.Status
		hint string
	}{
		{0, doctor.OK, "agrees"},
		{20 * time.Second, doctor.Warn, "behind the gateway's"},
		{-20 * time.Second, doctor.Warn, "ahead of the gateway's"},
		{3 * time.Minute, doctor.Warn, "behind the gateway's"},
		{2 * time.Hour, doctor.Fail, "certificates fail to verify"},
	} {
		addr, trust := clockGateway(t, tc.skew)
		r := doctor.GatewayClock(context.Background(), addr, "127.0.0.1", trust, "https://"+addr, 5*time.Second, time.Now)
		want(t, r, doctor.IDGatewayTime, tc.st, tc.hint)
		if !strings.Contains(r.Detail, "health SERVING") {
			t.Fatalf("detail %q", r.Detail)
		}
	}
}

func TestHelper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "helper.sock")
	want(t, doctor.Helper(ctx, missing, false, time.Second), doctor.IDHelper, doctor.OK, "needed only with bcd node --unprivileged")
	want(t, doctor.Helper(ctx, missing, true, time.Second), doctor.IDHelper, doctor.Fail, "start bcd-helper.service")

	serve := func(uid uint32) string {
		// Unix socket paths are short: keep it under /tmp.
		dir, err := os.MkdirTemp("", "bcdh")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		sock := filepath.Join(dir, "h.sock")
		hctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = helper.NewServer(helper.Config{Socket: sock, NodeUID: uid, NodeGID: uint32(os.Getgid())}, slog.New(slog.DiscardHandler)).Run(hctx)
		}()
		t.Cleanup(func() { cancel(); <-done })
		// Wait until the helper answers (a loaded machine may take seconds).
		c := &helper.Client{Socket: sock}
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := c.Ping(ctx)
			if err == nil || errors.Is(err, helper.ErrRefused) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("helper on %s never answered: %v", sock, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return sock
	}
	want(t, doctor.Helper(ctx, serve(uint32(os.Getuid())), false, 5*time.Second), doctor.IDHelper, doctor.OK, "answers")
	want(t, doctor.Helper(ctx, serve(uint32(os.Getuid())+1), false, 5*time.Second), doctor.IDHelper, doctor.Warn, "refused this user")
}

func writePlugin(t *testing.T, dir, name, script string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func TestPlugins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	want(t, doctor.Plugins(ctx, dir, time.Second)[0], doctor.IDPlugins, doctor.OK, "no plugins installed")
	writePlugin(t, dir, "bcx-good", "#!/bin/sh\n[ \"$1\" = --version ] && echo 'bcx-good 1.2.3' && exit 0\nexit 1\n", 0o755)
	writePlugin(t, dir, "bcx-noexec", "#!/bin/sh\necho hi\n", 0o644)
	writePlugin(t, dir, "bcx-broken", "#!/bin/sh\necho 'cannot load' >&2\nexit 3\n", 0o755)
	writePlugin(t, dir, "bcx-hangs", "#!/bin/sh\nexec sleep 30\n", 0o755)
	writePlugin(t, dir, "README", "not a plugin", 0o644)
	res := doctor.Plugins(ctx, dir, 500*time.Millisecond)
	got := map[string]doctor.Result{}
	for _, r := range res[1:] {
		got[r.Target] = r
	}
	want(t, res[0], doctor.IDPlugins, doctor.OK, "4 plugin(s)")
	want(t, got["bcx-good"], doctor.IDPlugin, doctor.OK, "version: bcx-good 1.2.3")
	want(t, got["bcx-noexec"], doctor.IDPlugin, doctor.Fail, "not executable")
	want(t, got["bcx-broken"], doctor.IDPlugin, doctor.Fail, "--version failed")
	want(t, got["bcx-hangs"], doctor.IDPlugin, doctor.Fail, "did not answer within 500ms")
	if len(res) != 5 {
		t.Fatalf("results %+v", res)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	want(t, doctor.Plugins(ctx, dir, time.Second)[0], doctor.IDPlugins, doctor.Fail, "writable by everyone")
}

func TestNVML(t *testing.T) {
	t.Parallel()
	want(t, doctor.NVML(dgxa100.New()), doctor.IDNVML, doctor.OK, "NVML sees 8 GPU(s)")
	want(t, doctor.NVML(noDriver{}), doctor.IDNVML, doctor.Warn, "no NVIDIA driver")
}
