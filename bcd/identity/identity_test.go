package identity_test

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
)

func newIdentity(t *testing.T, p *sessiontest.PKI) *identity.Identity {
	t.Helper()
	key, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	cert := p.NodeCertificate(t, key, "node-7", now.Add(-time.Minute), now.Add(time.Hour))
	return identity.FromJoin(&session.JoinResult{
		NodeID: "node-7", TrustDomain: p.TrustDomain, SPIFFEID: "spiffe://test.example/node/node-7",
		Chain: []*x509.Certificate{cert}, NodeCARoots: []*x509.Certificate{p.NodeCA},
		Gateways: []string{"https://gw1:8443", "https://gw2:8443"}, RenewAfter: now.Add(40 * time.Minute),
		Trust: session.Trust{Pin: p.Pin()}, PoolID: "pool", SiteID: "site", Region: "eu",
	}, key, nil, now)
}

func TestSaveLoadPin(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	dir := filepath.Join(t.TempDir(), "bcd")
	st := identity.NewStore(dir)
	if _, err := st.Load(); !errors.Is(err, identity.ErrNotJoined) {
		t.Fatalf("Load of an empty dir = %v, want ErrNotJoined", err)
	}
	if err := st.Prepare(); err != nil {
		t.Fatal(err)
	}
	id := newIdentity(t, p)
	if err := st.Save(id); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, identity.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", fi.Mode().Perm())
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	got, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeID != "node-7" || got.SPIFFEID != id.SPIFFEID || got.GatewayPin != p.Pin() ||
		len(got.Gateways) != 2 || !got.RenewAfter.Equal(id.RenewAfter) || got.Region != "eu" ||
		!got.JoinedAt.Equal(id.JoinedAt) || len(got.GatewayCAs) != 0 {
		t.Errorf("loaded %+v", got)
	}
	if !got.Chain[0].Equal(id.Chain[0]) || !got.NodeCARoots[0].Equal(p.NodeCA) {
		t.Error("certificates differ after load")
	}
	if tr := got.Trust(); tr.Pin != p.Pin() || tr.Roots != nil {
		t.Errorf("trust = %+v", tr)
	}
	// The loaded key and chain make a valid client config.
	if _, err := session.New(session.Config{Gateways: got.Gateways, Trust: got.Trust(), Key: got.Key, Chain: got.Chain}); err != nil {
		t.Errorf("client from loaded identity: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestSaveLoadCAFileThenPin(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	st := identity.NewStore(t.TempDir())
	id := newIdentity(t, p)
	id.GatewayPin, id.GatewayCAs = "", []*x509.Certificate{p.GatewayCA}
	if err := st.Save(id); err != nil {
		t.Fatal(err)
	}
	got, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(got.GatewayCAs) != 1 || got.GatewayPin != "" || got.Trust().Roots == nil {
		t.Errorf("CA trust not kept: %+v", got)
	}
	// A re-join with a pin drops the CA file.
	id2 := newIdentity(t, p)
	if err := st.Save(id2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(st.Dir(), identity.GatewayCAFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gateway CA file still there: %v", err)
	}
}

func TestSaveRenewal(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	st := identity.NewStore(t.TempDir())
	id := newIdentity(t, p)
	if err := st.Save(id); err != nil {
		t.Fatal(err)
	}
	keyBefore, _ := os.ReadFile(filepath.Join(st.Dir(), identity.KeyFile))
	now := time.Now().Truncate(time.Second)
	cert := p.NodeCertificate(t, sessiontest.NewKey(t), "node-7", now, now.Add(2*time.Hour))
	id.Renewed(&session.Renewal{Chain: []*x509.Certificate{cert}, NodeCARoots: []*x509.Certificate{p.NodeCA}, RenewAfter: now.Add(80 * time.Minute)})
	if err := st.SaveRenewal(id); err != nil {
		t.Fatal(err)
	}
	got, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !got.Chain[0].Equal(cert) || !got.RenewAfter.Equal(now.Add(80*time.Minute)) || !got.NotAfter().Equal(cert.NotAfter) {
		t.Errorf("renewal not saved: %+v", got)
	}
	keyAfter, _ := os.ReadFile(filepath.Join(st.Dir(), identity.KeyFile))
	if string(keyBefore) != string(keyAfter) {
		t.Error("renewal rewrote the key")
	}
}

func TestLoadCorrupt(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	st := identity.NewStore(t.TempDir())
	if err := st.Save(newIdentity(t, p)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(st.Dir(), identity.KeyFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load(); err == nil || errors.Is(err, identity.ErrNotJoined) {
		t.Errorf("Load with a corrupt key = %v, want an error", err)
	}
}

func TestReadCertificates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("nothing"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.ReadCertificates(empty); err == nil {
		t.Error("ReadCertificates of a file without certificates succeeded")
	}
	if _, err := identity.ReadCertificates(filepath.Join(dir, "missing")); err == nil {
		t.Error("ReadCertificates of a missing file succeeded")
	}
}

// TestLockExcludesASecondHolder: while one holder has the data directory,
// a second Lock fails with ErrInUse; after release it succeeds.
func TestLockExcludesASecondHolder(t *testing.T) {
	t.Parallel()
	s := identity.NewStore(t.TempDir())
	release, err := s.Lock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lock(); !errors.Is(err, identity.ErrInUse) {
		t.Fatalf("second Lock: %v, want ErrInUse", err)
	}
	release()
	again, err := s.Lock()
	if err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
	again()
	if _, err := identity.NewStore(filepath.Join(t.TempDir(), "missing")).Lock(); err == nil || errors.Is(err, identity.ErrInUse) {
		t.Fatalf("Lock of a missing directory: %v, want an error other than ErrInUse", err)
	}
}
