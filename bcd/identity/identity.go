package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
)

// DefaultDir is bcd's data directory when none is given.
const DefaultDir = "/var/lib/bcd"

// Names of the files in the data directory.
const (
	KeyFile       = "node.key"
	CertFile      = "node.crt"
	NodeCAFile    = "node-ca.crt"
	GatewayCAFile = "gateway-ca.crt"
	InfoFile      = "identity.json"
)

// ErrNotJoined reports a data directory that holds no identity.
var ErrNotJoined = errors.New("node not joined")

// ErrInUse is returned by Lock when another process holds the data
// directory.
var ErrInUse = errors.New("data directory in use by another bcd node")

// LockFile is the file in the data directory that bcd node holds an
// exclusive lock (flock) on while it runs.
const LockFile = "bcd.lock"

// Identity is everything a joined node keeps.
type Identity struct {
	// NodeID is the id the control plane gave the node.
	NodeID string
	// TrustDomain is the SPIFFE trust domain.
	TrustDomain string
	// SPIFFEID is spiffe://<TrustDomain>/node/<NodeID>.
	SPIFFEID string
	// Key is the node's private key.
	Key crypto.Signer
	// Chain is the node's certificate chain, leaf first.
	Chain []*x509.Certificate
	// NodeCARoots are the node CA roots.
	NodeCARoots []*x509.Certificate
	// GatewayPin is the pin gateways are verified with, "sha256/...";
	// empty when GatewayCAs is used instead.
	GatewayPin string
	// GatewayPins are further pins gateways may be verified with, beside
	// GatewayPin: a two-pin join token's second pin, and the gateway
	// serving CAs of a gateway-CA rotation (KeepGatewayRoots).
	GatewayPins []string
	// GatewayCAs are the CAs gateways are verified against, when the node
	// joined with a CA file; empty when GatewayPin is used.
	GatewayCAs []*x509.Certificate
	// Gateways are the URLs of the region's gateways.
	Gateways []string
	// RenewAfter is when the certificate is due for renewal.
	RenewAfter time.Time
	// PoolID, SiteID and Region place the node.
	PoolID, SiteID, Region string
	// JoinedAt is when the node joined.
	JoinedAt time.Time
	// ReattestGrace is how long after the certificate's expiry the
	// gateways re-attest it, as they last said; zero when unknown.
	ReattestGrace time.Duration
	// KnownGateways are the gateways Welcomes listed (session.MergeGateways),
	// tried before the join-time Gateways.
	KnownGateways []session.KnownGateway
}

// FromJoin builds the Identity of a node that joined with key and got res.
// gatewayCAs are the CA certificates res.Trust.Roots was made from, when
// the node joined with a CA file.
func FromJoin(res *session.JoinResult, key crypto.Signer, gatewayCAs []*x509.Certificate, now time.Time) *Identity {
	id := &Identity{
		NodeID:        res.NodeID,
		TrustDomain:   res.TrustDomain,
		SPIFFEID:      res.SPIFFEID,
		Key:           key,
		Chain:         res.Chain,
		NodeCARoots:   res.NodeCARoots,
		Gateways:      slices.Clone(res.Gateways),
		RenewAfter:    res.RenewAfter,
		PoolID:        res.PoolID,
		SiteID:        res.SiteID,
		Region:        res.Region,
		JoinedAt:      now.UTC(),
		ReattestGrace: res.ReattestGrace,
	}
	if res.Trust.Roots != nil {
		id.GatewayCAs = gatewayCAs
	} else {
		id.GatewayPin = res.Trust.Pin
		id.GatewayPins = slices.Clone(res.Trust.ExtraPins)
	}
	return id
}

// Trust returns how the node verifies gateways.
func (id *Identity) Trust() session.Trust {
	if len(id.GatewayCAs) > 0 {
		pool := x509.NewCertPool()
		for _, c := range id.GatewayCAs {
			pool.AddCert(c)
		}
		return session.Trust{Roots: pool}
	}
	return session.Trust{Pin: id.GatewayPin, ExtraPins: slices.Clone(id.GatewayPins)}
}

// Renewed applies a renewal to id.
func (id *Identity) Renewed(r *session.Renewal) {
	id.Chain = r.Chain
	if len(r.NodeCARoots) > 0 {
		id.NodeCARoots = r.NodeCARoots
	}
	id.RenewAfter = r.RenewAfter
	if r.ReattestGrace > 0 {
		id.ReattestGrace = r.ReattestGrace
	}
}

// NotAfter is the end of the leaf certificate's validity.
func (id *Identity) NotAfter() time.Time { return id.Chain[0].NotAfter }

// GenerateKey makes a new node key: ECDSA on P-256.
func GenerateKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate node key: %w", err)
	}
	return k, nil
}

// info is the JSON form of identity.json.
type info struct {
	Version     int       `json:"version"`
	NodeID      string    `json:"node_id"`
	TrustDomain string    `json:"trust_domain"`
	SPIFFEID    string    `json:"spiffe_id"`
	Gateways    []string  `json:"gateways"`
	GatewayPin  string    `json:"gateway_pin,omitempty"`
	GatewayPins []string  `json:"gateway_pins,omitempty"`
	RenewAfter  time.Time `json:"renew_after"`
	PoolID      string    `json:"pool_id,omitempty"`
	SiteID      string    `json:"site_id,omitempty"`
	Region      string    `json:"region,omitempty"`
	JoinedAt    time.Time `json:"joined_at"`
	// ReattestGrace is in seconds; absent when unknown.
	ReattestGrace int64                  `json:"reattest_grace_s,omitempty"`
	KnownGateways []session.KnownGateway `json:"known_gateways,omitempty"`
}

// infoVersion is the layout version of identity.json this package writes.
const infoVersion = 1

// Store reads and writes the identity in one data directory.
type Store struct {
	dir string
}

// NewStore returns the Store of data directory dir (DefaultDir when
// empty).
func NewStore(dir string) *Store {
	if dir == "" {
		dir = DefaultDir
	}
	return &Store{dir: dir}
}

// Dir returns the data directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(name string) string { return filepath.Join(s.dir, name) }

// Exists reports whether the directory holds an identity.
func (s *Store) Exists() (bool, error) {
	_, err := os.Stat(s.path(InfoFile))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("identity: %w", err)
}

// Prepare creates the data directory (mode 0700) if needed and checks that
// files can be written in it, so that a join fails before it uses up its
// token when the identity could not be kept.
func (s *Store) Prepare() error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	f, err := os.CreateTemp(s.dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("data directory %s is not writable: %w", s.dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// Lock takes an exclusive advisory lock on the data directory (flock on
// LockFile, created mode 0600), so that two bcd node processes cannot run
// one identity: at the gateway they would supersede each other's sessions
// without end. It fails with ErrInUse when another process holds it. The
// lock lasts until release is called or the process exits; it is not
// inherited across exec.
func (s *Store) Lock() (release func(), err error) {
	f, err := os.OpenFile(s.path(LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data directory %s: %w", s.dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked (%s): stop the other bcd node first", ErrInUse, s.dir, LockFile)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", s.dir, err)
	}
	return func() { f.Close() }, nil
}

// Load reads the identity. It fails with ErrNotJoined when there is none.
func (s *Store) Load() (*Identity, error) {
	id, err := s.load()
	if err != nil {
		return nil, fmt.Errorf("load identity from %s: %w", s.dir, err)
	}
	return id, nil
}

func (s *Store) load() (*Identity, error) {
	raw, err := os.ReadFile(s.path(InfoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotJoined
	}
	if err != nil {
		return nil, err
	}
	var in info
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, fmt.Errorf("%s: %w", InfoFile, err)
	}
	if in.Version != infoVersion {
		return nil, fmt.Errorf("%s: layout version %d, this bcd reads %d", InfoFile, in.Version, infoVersion)
	}
	id := &Identity{
		NodeID: in.NodeID, TrustDomain: in.TrustDomain, SPIFFEID: in.SPIFFEID,
		Gateways: in.Gateways, GatewayPin: in.GatewayPin, GatewayPins: in.GatewayPins, RenewAfter: in.RenewAfter,
		PoolID: in.PoolID, SiteID: in.SiteID, Region: in.Region, JoinedAt: in.JoinedAt,
		ReattestGrace: time.Duration(in.ReattestGrace) * time.Second, KnownGateways: in.KnownGateways,
	}
	if id.Key, err = readKey(s.path(KeyFile)); err != nil {
		return nil, err
	}
	if id.Chain, err = readCerts(s.path(CertFile)); err != nil {
		return nil, err
	}
	if len(id.Chain) == 0 {
		return nil, fmt.Errorf("%s: no certificate", CertFile)
	}
	if id.NodeCARoots, err = readCerts(s.path(NodeCAFile)); err != nil {
		return nil, err
	}
	if in.GatewayPin == "" {
		if id.GatewayCAs, err = readCerts(s.path(GatewayCAFile)); err != nil {
			return nil, err
		}
		if len(id.GatewayCAs) == 0 {
			return nil, fmt.Errorf("neither a gateway pin nor %s", GatewayCAFile)
		}
	}
	return id, nil
}

// JoinKey returns the key for a join: the one in the data directory, when
// an earlier join left it (a join that failed or whose reply was lost: the
// retry is the same joiner, DESIGN.md "Join is idempotent per key"), or a
// new one, written (mode 0600) before it is returned, so that it outlives
// a crash during the join. created reports a new key. Nothing in bcd
// deletes the key when a join fails.
func (s *Store) JoinKey() (key crypto.Signer, created bool, err error) {
	key, err = readKey(s.path(KeyFile))
	switch {
	case err == nil:
		return key, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, fmt.Errorf("join key in %s: %w", s.dir, err)
	}
	k, err := GenerateKey()
	if err != nil {
		return nil, false, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, false, fmt.Errorf("encode key: %w", err)
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, false, err
	}
	if err := writeFile(s.path(KeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, false, fmt.Errorf("write join key to %s: %w", s.dir, err)
	}
	return k, true, nil
}

// Save writes the whole identity: the key (mode 0600), certificates, CAs
// and last identity.json. A gateway CA file left by an earlier join with
// --ca-file is removed when id uses a pin.
func (s *Store) Save(id *Identity) error {
	if err := s.save(id); err != nil {
		return fmt.Errorf("save identity to %s: %w", s.dir, err)
	}
	return nil
}

func (s *Store) save(id *Identity) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(id.Key)
	if err != nil {
		return fmt.Errorf("encode key: %w", err)
	}
	if err := writeFile(s.path(KeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	if err := s.writeCerts(id); err != nil {
		return err
	}
	if len(id.GatewayCAs) > 0 {
		if err := writeFile(s.path(GatewayCAFile), encodeCerts(id.GatewayCAs), 0o644); err != nil {
			return err
		}
	} else if err := os.Remove(s.path(GatewayCAFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return s.writeInfo(id)
}

// SaveRenewal writes what a renewal changed: the certificate chain, the
// node CA roots and the renew-after time. The key is unchanged.
func (s *Store) SaveRenewal(id *Identity) error {
	if err := s.writeCerts(id); err != nil {
		return fmt.Errorf("save renewed certificate to %s: %w", s.dir, err)
	}
	if err := s.writeInfo(id); err != nil {
		return fmt.Errorf("save renewed certificate to %s: %w", s.dir, err)
	}
	return nil
}

// SaveNodeCARoots writes the node CA roots (node-ca.crt), as a node-CA
// rotation's Bundle message carries them.
func (s *Store) SaveNodeCARoots(id *Identity) error {
	if err := writeFile(s.path(NodeCAFile), encodeCerts(id.NodeCARoots), 0o644); err != nil {
		return fmt.Errorf("save node CA roots to %s: %w", s.dir, err)
	}
	return nil
}

// SaveGatewayTrust writes how gateways are trusted after a gateway-CA
// rotation's Bundle: the pins (identity.json) or, for a node that joined
// with a CA file, the gateway CAs (GatewayCAFile).
func (s *Store) SaveGatewayTrust(id *Identity) error {
	var err error
	if id.GatewayPin != "" {
		err = s.writeInfo(id)
	} else {
		err = writeFile(s.path(GatewayCAFile), encodeCerts(id.GatewayCAs), 0o644)
	}
	if err != nil {
		return fmt.Errorf("save gateway trust to %s: %w", s.dir, err)
	}
	return nil
}

// SaveGateways writes the node's gateway list (identity.json).
func (s *Store) SaveGateways(id *Identity) error {
	if err := s.writeInfo(id); err != nil {
		return fmt.Errorf("save gateway list to %s: %w", s.dir, err)
	}
	return nil
}

func (s *Store) writeCerts(id *Identity) error {
	if err := writeFile(s.path(CertFile), encodeCerts(id.Chain), 0o644); err != nil {
		return err
	}
	return writeFile(s.path(NodeCAFile), encodeCerts(id.NodeCARoots), 0o644)
}

func (s *Store) writeInfo(id *Identity) error {
	raw, err := json.MarshalIndent(info{
		Version: infoVersion, NodeID: id.NodeID, TrustDomain: id.TrustDomain, SPIFFEID: id.SPIFFEID,
		Gateways: id.Gateways, GatewayPin: id.GatewayPin, GatewayPins: id.GatewayPins, RenewAfter: id.RenewAfter.UTC(),
		PoolID: id.PoolID, SiteID: id.SiteID, Region: id.Region, JoinedAt: id.JoinedAt.UTC(),
		ReattestGrace: int64(id.ReattestGrace / time.Second), KnownGateways: id.KnownGateways,
	}, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(s.path(InfoFile), append(raw, '\n'), 0o644)
}

// ReadCertificates reads every CERTIFICATE block of a PEM file, as given
// to `bcd join --ca-file`.
func ReadCertificates(path string) ([]*x509.Certificate, error) {
	certs, err := readCerts(path)
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s: no PEM CERTIFICATE block", path)
	}
	return certs, nil
}

func readCerts(path string) ([]*x509.Certificate, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, raw = pem.Decode(raw)
		if b == nil {
			return out, nil
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, c)
	}
}

func readKey(path string) (crypto.Signer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b, _ := pem.Decode(raw)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: no PEM PRIVATE KEY block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: %T is not a signing key", path, k)
	}
	return signer, nil
}

func encodeCerts(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// writeFile replaces path with data atomically: a temporary file in the
// same directory with mode perm, fsync, rename over path, fsync of the
// directory.
func writeFile(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
