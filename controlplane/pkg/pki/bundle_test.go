package pki

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/proto/jointoken"
)

func TestInit(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	cas := map[string]*CA{"node": b.NodeCA, "gateway": b.GatewayCA, "internal": b.InternalCA}
	seen := map[string]string{}
	for name, ca := range cas {
		c := ca.Cert
		if !c.IsCA || !c.MaxPathLenZero || c.MaxPathLen != 0 || c.KeyUsage&x509.KeyUsageCertSign == 0 {
			t.Errorf("%s CA: IsCA=%v MaxPathLen=%d zero=%v KeyUsage=%b", name, c.IsCA, c.MaxPathLen, c.MaxPathLenZero, c.KeyUsage)
		}
		if err := c.CheckSignatureFrom(c); err != nil {
			t.Errorf("%s CA is not self-signed: %v", name, err)
		}
		if got, want := c.NotAfter, testNow.Add(DefaultCAValidity); !got.Equal(want) {
			t.Errorf("%s CA NotAfter = %s, want %s (ten years)", name, got, want)
		}
		if !c.NotBefore.Before(testNow) {
			t.Errorf("%s CA NotBefore = %s, not before %s", name, c.NotBefore, testNow)
		}
		if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://compute.example.com" {
			t.Errorf("%s CA URIs = %v, want the trust domain's SPIFFE ID", name, c.URIs)
		}
		pin := jointoken.Pin(c)
		if other, ok := seen[pin]; ok {
			t.Errorf("%s CA and %s CA share a key", name, other)
		}
		seen[pin] = name
	}
	if got := b.NodeCARoots(); len(got) != 1 || got[0] != b.NodeCA.Cert {
		t.Errorf("NodeCARoots = %v, want the node CA only", got)
	}
	if !jointoken.MatchPin(b.GatewayPin(), []*x509.Certificate{b.GatewayCA.Cert}) ||
		jointoken.MatchPin(b.GatewayPin(), []*x509.Certificate{b.NodeCA.Cert}) {
		t.Error("GatewayPin does not name the gateway serving CA's key alone")
	}
}

func TestInitOptions(t *testing.T) {
	t.Parallel()
	b, err := Init(InitOptions{TrustDomain: "td", Now: testNow, Validity: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := b.NodeCA.Cert.NotAfter, testNow.Add(48*time.Hour); !got.Equal(want) {
		t.Fatalf("NotAfter = %s, want %s", got, want)
	}
	if _, err := Init(InitOptions{TrustDomain: "td", Validity: -time.Hour}); !errors.Is(err, ErrTTL) {
		t.Fatalf("negative validity: error = %v, want ErrTTL", err)
	}
	b, err = Init(InitOptions{TrustDomain: "td"})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(b.NodeCA.Cert.NotAfter) - DefaultCAValidity; d > time.Minute || d < -time.Minute {
		t.Fatalf("zero Now: NotAfter %s is not ten years from now", b.NodeCA.Cert.NotAfter)
	}
}

func TestValidateTrustDomain(t *testing.T) {
	t.Parallel()
	for _, td := range []string{"example.org", "compute.example.com", "a", "td_1-x.y", strings.Repeat("a", MaxTrustDomainLen)} {
		if err := ValidateTrustDomain(td); err != nil {
			t.Errorf("ValidateTrustDomain(%q): %v", td, err)
		}
	}
	for _, td := range []string{
		"", "Example.org", "spiffe://example.org", "https://example.org", "example.org:443",
		"example.org/path", "exa mple.org", "ex@mple.org", "exämple.org", "example.org\n",
		strings.Repeat("a", MaxTrustDomainLen+1),
	} {
		if err := ValidateTrustDomain(td); !errors.Is(err, ErrTrustDomain) {
			t.Errorf("ValidateTrustDomain(%q) = %v, want ErrTrustDomain", td, err)
		}
		if _, err := Init(InitOptions{TrustDomain: td}); !errors.Is(err, ErrTrustDomain) {
			t.Errorf("Init(%q) = %v, want ErrTrustDomain", td, err)
		}
	}
}

// sameBundle fails t unless a and b hold the same certificates and keys.
func sameBundle(t *testing.T, a, b *Bundle) {
	t.Helper()
	if a.TrustDomain != b.TrustDomain {
		t.Fatalf("trust domain %q, want %q", b.TrustDomain, a.TrustDomain)
	}
	for _, pair := range [][2]*CA{{a.NodeCA, b.NodeCA}, {a.GatewayCA, b.GatewayCA}, {a.InternalCA, b.InternalCA}} {
		if !pair[0].Cert.Equal(pair[1].Cert) || !pair[0].Key.Equal(pair[1].Key) {
			t.Fatal("a CA's certificate or key changed in the round trip")
		}
	}
	if len(a.PreviousNodeRoots) != len(b.PreviousNodeRoots) {
		t.Fatalf("%d previous roots, want %d", len(b.PreviousNodeRoots), len(a.PreviousNodeRoots))
	}
	for i := range a.PreviousNodeRoots {
		if !a.PreviousNodeRoots[i].Equal(b.PreviousNodeRoots[i]) {
			t.Fatalf("previous root %d changed", i)
		}
	}
}

func TestBundleMarshalSealRoundTrip(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := UnmarshalBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	sameBundle(t, b, decoded)

	sealed, err := b.SealBundle(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("PRIVATE KEY")) || bytes.Contains(sealed, []byte("compute.example.com")) {
		t.Fatal("sealed bundle leaks its contents")
	}
	opened, err := OpenBundle(testSecret, sealed)
	if err != nil {
		t.Fatal(err)
	}
	sameBundle(t, b, opened)

	// What opened works: it issues certificates the original verifies.
	_, cert := issueNode(t, opened, "node-1", IssueOptions{})
	if _, _, err := b.VerifyNode([]*x509.Certificate{cert}, testNow); err != nil {
		t.Fatalf("certificate from the opened bundle: %v", err)
	}

	if _, err := OpenBundle(strings.ToUpper(testSecret), sealed); !errors.Is(err, ErrSealOpen) {
		t.Fatalf("OpenBundle with a wrong secret: error = %v, want ErrSealOpen", err)
	}
	if _, err := OpenBundle("short", sealed); !errors.Is(err, ErrSecretTooShort) {
		t.Fatalf("OpenBundle with a short secret: error = %v, want ErrSecretTooShort", err)
	}
	if _, err := b.SealBundle("short"); !errors.Is(err, ErrSecretTooShort) {
		t.Fatalf("SealBundle with a short secret: error = %v, want ErrSecretTooShort", err)
	}
	// Another value sealed under the same secret is not a bundle.
	other, err := Seal(testSecret, data, []byte("something else"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenBundle(testSecret, other); !errors.Is(err, ErrSealOpen) {
		t.Fatalf("OpenBundle of a value sealed for another use: error = %v, want ErrSealOpen", err)
	}
}

func TestUnmarshalBundleInvalid(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	tests := map[string][]byte{
		"garbage":       []byte("not json"),
		"empty":         nil,
		"two objects":   append(bytes.Clone(data), data...),
		"unknown field": edit(func(m map[string]any) { m["extra"] = 1 }),
		"format 2":      edit(func(m map[string]any) { m["format"] = 2 }),
		"no format":     edit(func(m map[string]any) { delete(m, "format") }),
		"bad td":        edit(func(m map[string]any) { m["trustDomain"] = "Bad TD" }),
		"no node CA":    edit(func(m map[string]any) { delete(m, "nodeCA") }),
		"swapped keys":  edit(swapKeys),
		"bad cert PEM": edit(func(m map[string]any) {
			m["internalCA"].(map[string]any)["cert"] = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
		}),
		"key as cert":    edit(func(m map[string]any) { ca := m["internalCA"].(map[string]any); ca["cert"] = ca["key"] }),
		"bad prev root":  edit(func(m map[string]any) { m["previousNodeRoots"] = []string{"junk"} }),
		"leaf prev root": edit(func(m map[string]any) { m["previousNodeRoots"] = []string{string(leafPEM(t, b))} }),
	}
	for name, in := range tests {
		if _, err := UnmarshalBundle(in); !errors.Is(err, ErrBundleInvalid) {
			t.Errorf("%s: error = %v, want ErrBundleInvalid", name, err)
		}
	}
	if _, err := (&Bundle{TrustDomain: "td"}).Marshal(); !errors.Is(err, ErrBundleInvalid) {
		t.Errorf("Marshal of an empty bundle: error = %v, want ErrBundleInvalid", err)
	}
	var nilBundle *Bundle
	if err := nilBundle.Validate(); !errors.Is(err, ErrBundleInvalid) {
		t.Errorf("Validate of nil: error = %v, want ErrBundleInvalid", err)
	}
}

// swapKeys gives the encoded node and gateway CA certificates each other's
// keys.
func swapKeys(m map[string]any) {
	node, gw := m["nodeCA"].(map[string]any), m["gatewayCA"].(map[string]any)
	node["key"], gw["key"] = gw["key"], node["key"]
}

func leafPEM(t *testing.T, b *Bundle) []byte {
	_, cert := issueNode(t, b, "leaf", IssueOptions{})
	return EncodeCertificatesPEM(cert)
}

func TestRotateNodeCA(t *testing.T) {
	t.Parallel()
	b, err := Init(InitOptions{TrustDomain: "td", Now: testNow, Validity: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	oldRoot := b.NodeCA.Cert
	_, before := issueNode(t, b, "node-old", IssueOptions{})

	rotatedAt := testNow.Add(time.Hour)
	if err := b.RotateNodeCA(rotatedAt, 0); err != nil {
		t.Fatal(err)
	}
	if b.NodeCA.Cert.Equal(oldRoot) {
		t.Fatal("RotateNodeCA kept the old CA")
	}
	roots := b.NodeCARoots()
	if len(roots) != 2 || roots[0] != b.NodeCA.Cert || roots[1] != oldRoot {
		t.Fatalf("NodeCARoots = %d roots, want the new CA then the old one", len(roots))
	}
	_, after := issueNode(t, b, "node-new", IssueOptions{Now: rotatedAt})
	if err := after.CheckSignatureFrom(b.NodeCA.Cert); err != nil {
		t.Fatalf("new certificates do not come from the new CA: %v", err)
	}
	for name, cert := range map[string]*x509.Certificate{"before": before, "after": after} {
		if _, _, err := b.VerifyNode([]*x509.Certificate{cert}, rotatedAt); err != nil {
			t.Errorf("certificate issued %s rotation: %v", name, err)
		}
	}

	// The retained root survives the bundle's round trip.
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := UnmarshalBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	sameBundle(t, b, decoded)

	if n := b.PruneNodeRoots(oldRoot.NotAfter); n != 0 {
		t.Fatalf("PruneNodeRoots at the old root's last second dropped %d", n)
	}
	if n := b.PruneNodeRoots(oldRoot.NotAfter.Add(time.Second)); n != 1 || len(b.NodeCARoots()) != 1 {
		t.Fatalf("PruneNodeRoots after expiry dropped %d, left %d roots", n, len(b.NodeCARoots()))
	}
	if _, _, err := b.VerifyNode([]*x509.Certificate{before}, rotatedAt); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("certificate of a pruned root: error = %v, want ErrUntrusted", err)
	}
	if err := (&Bundle{TrustDomain: "td"}).RotateNodeCA(testNow, 0); !errors.Is(err, ErrBundleInvalid) {
		t.Fatalf("RotateNodeCA of an empty bundle: error = %v, want ErrBundleInvalid", err)
	}
}
