package session

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/proto/jointoken"
)

// testLocal is this machine's clock in these tests: fixed.
var testLocal = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// logBuffer returns a logger writing text into a buffer.
func logBuffer() (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	return slog.New(slog.NewTextHandler(&buf, nil)), &buf
}

func TestSkewText(t *testing.T) {
	t.Parallel()
	for skew, want := range map[time.Duration]string{
		-90 * time.Minute:        "this machine's clock is 5400 s behind the gateway's",
		90*time.Second + 400*1e6: "this machine's clock is 90 s ahead of the gateway's",
		200 * time.Millisecond:   "this machine's clock agrees with the gateway's",
	} {
		if got := skewText(skew); got != want {
			t.Errorf("skewText(%s) = %q, want %q", skew, got, want)
		}
	}
}

// TestGatewayClockObserve checks the rule of DESIGN.md "Clocks" with an
// injected clock: within a minute this machine's clock is trusted and
// nothing is logged; beyond, answers are judged by the gateway's time, the
// offset is kept for later verification, and the skew is logged once, in
// seconds with its direction, until it changes or goes away.
func TestGatewayClockObserve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log, buf := logBuffer()
	g := newGatewayClock(func() time.Time { return testLocal }, nil, log)
	const gw = "https://gw.example.com"

	// No time in the answer (an older gateway): this machine's clock.
	if judge, skew := g.observe(ctx, gw, nil); !judge.Equal(testLocal) || skew != 0 {
		t.Fatalf("no server time: judged at %s, skew %s", judge, skew)
	}
	// Within a minute: this machine's clock, nothing logged.
	if judge, skew := g.observe(ctx, gw, timestamppb.New(testLocal.Add(59*time.Second))); !judge.Equal(testLocal) || skew != -59*time.Second {
		t.Fatalf("59 s: judged at %s, skew %s", judge, skew)
	}
	if buf.Len() != 0 || !g.now().Equal(testLocal) {
		t.Fatalf("59 s: now %s, logged %q", g.now(), buf)
	}

	// 90 minutes behind: the gateway's time, logged, and kept.
	theirs := testLocal.Add(90 * time.Minute)
	if judge, skew := g.observe(ctx, gw, timestamppb.New(theirs)); !judge.Equal(theirs) || skew != -90*time.Minute {
		t.Fatalf("90 min behind: judged at %s, skew %s", judge, skew)
	}
	if !g.now().Equal(theirs) {
		t.Fatalf("now after the skew = %s, want the gateway's %s", g.now(), theirs)
	}
	out := buf.String()
	for _, want := range []string{"level=WARN", `clock_skew="this machine's clock is 5400 s behind the gateway's"`, "clock_skew_s=-5400", "gateway=" + gw} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
	// The same skew again is not logged again; one that moved is.
	buf.Reset()
	g.observe(ctx, gw, timestamppb.New(theirs.Add(30*time.Second)))
	if buf.Len() != 0 {
		t.Errorf("unchanged skew logged again: %q", buf)
	}
	g.observe(ctx, gw, timestamppb.New(testLocal.Add(-2*time.Hour)))
	if !strings.Contains(buf.String(), "7200 s ahead of the gateway's") {
		t.Errorf("changed skew not logged: %q", buf)
	}
	// Back within a minute: this machine's clock again, and said so.
	buf.Reset()
	if judge, _ := g.observe(ctx, gw, timestamppb.New(testLocal)); !judge.Equal(testLocal) || !g.now().Equal(testLocal) {
		t.Fatalf("clocks agree again: judged at %s, now %s", judge, g.now())
	}
	if !strings.Contains(buf.String(), "agrees with the gateway's again") {
		t.Errorf("agreement not logged: %q", buf)
	}
}

// TestGatewayClockFloor checks that the estimate is never earlier than the
// floor (the current certificate's NotBefore), even before any answer.
func TestGatewayClockFloor(t *testing.T) {
	t.Parallel()
	floor := testLocal.Add(30 * time.Minute)
	g := newGatewayClock(func() time.Time { return testLocal }, func() time.Time { return floor }, slog.New(slog.DiscardHandler))
	if got := g.now(); !got.Equal(floor) {
		t.Fatalf("now = %s, want the floor %s", got, floor)
	}
	g.observe(context.Background(), "gw", timestamppb.New(testLocal.Add(2*time.Hour)))
	if got := g.now(); !got.Equal(testLocal.Add(2 * time.Hour)) {
		t.Fatalf("now past the floor = %s", got)
	}
}

// TestCheckIssuedByGatewayTime is the rule that a wrong clock never refuses
// a certificate the gateway issued: not yet valid by this machine's clock,
// valid by the gateway's.
func TestCheckIssuedByGatewayTime(t *testing.T) {
	t.Parallel()
	ca, caKey := testCA(t, "node CA", testLocal.Add(-24*time.Hour))
	key := testKey(t)
	gwNow := testLocal.Add(90 * time.Minute) // this machine is 90 min behind
	leaf := testLeaf(t, ca, caKey, &key.PublicKey, "node-1", gwNow.Add(-time.Hour), gwNow.Add(time.Hour), x509.ExtKeyUsageClientAuth)
	chain, roots := []*x509.Certificate{leaf}, []*x509.Certificate{ca}
	if err := checkIssued(chain, roots, key, testLocal); err == nil {
		t.Fatal("not yet valid by this machine's clock, yet accepted: the test proves nothing")
	}
	g := newGatewayClock(func() time.Time { return testLocal }, nil, slog.New(slog.DiscardHandler))
	judge, _ := g.observe(context.Background(), "gw", timestamppb.New(gwNow))
	if err := checkIssued(chain, roots, key, judge); err != nil {
		t.Fatalf("judged by the gateway's time: %v", err)
	}
}

// TestVerifySaysClock checks that a gateway certificate outside its
// validity is reported as a clock problem with this machine's reading, not
// as a pin mismatch, and that verification uses the gateway-corrected time.
func TestVerifySaysClock(t *testing.T) {
	t.Parallel()
	ca, caKey := testCA(t, "gateway CA", testLocal.Add(-24*time.Hour))
	key := testKey(t)
	issued := testLocal.Add(2 * time.Hour) // issued 2 h after this machine's "now"
	leaf := testLeaf(t, ca, caKey, &key.PublicKey, "gw.example.com", issued.Add(-time.Hour), issued.Add(24*time.Hour), x509.ExtKeyUsageServerAuth)
	chain := []*x509.Certificate{leaf, ca}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for name, tr := range map[string]Trust{"pin": {Pin: jointoken.Pin(ca)}, "pool": {Roots: pool}} {
		err := tr.verify(chain, "gw.example.com", testLocal, testLocal)
		var ci x509.CertificateInvalidError
		if !errors.Is(err, ErrUntrustedGateway) || !errors.As(err, &ci) || ci.Reason != x509.Expired {
			t.Fatalf("%s: verify = %v, want ErrUntrustedGateway wrapping a validity error", name, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, "certificate not yet valid / expired: this machine's clock reads 2031-03-04T05:06:07Z") ||
			strings.Contains(msg, "pinned key") {
			t.Errorf("%s: error %q does not name the clock", name, msg)
		}
		// By the gateway's time, as a gatewayClock gives it, it verifies.
		if err := tr.verify(chain, "gw.example.com", testLocal, issued); err != nil {
			t.Errorf("%s: at the gateway's time: %v", name, err)
		}
	}
}

func testKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// testCA makes a CA valid from notBefore for ten years.
func testCA(t *testing.T, cn string, notBefore time.Time) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := testKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notBefore.Add(10 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

// testLeaf issues a leaf for pub named cn (also its DNS name) from ca.
func testLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, pub *ecdsa.PublicKey, cn string, notBefore, notAfter time.Time, usage x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn}, DNSNames: []string{cn},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
