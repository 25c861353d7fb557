package bootstrap

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
)

// InternalCertFile and InternalKeyFile are the file names pki
// issue-internal writes: the certificate of a control-plane process for the
// internal control API (host.gateway.internal.tlsFiles).
const (
	InternalCertFile = "internal.crt"
	InternalKeyFile  = "internal.key"
)

// WriteInternalCert issues an internal certificate for process name
// (pki.Bundle.IssueInternal: the dns names and ips are those the process is
// dialled by, none for an api-only process) valid for ttl (zero: one year),
// and writes DIR/internal.crt and DIR/internal.key, mode 0600, each through
// a temporary file renamed over it, so a process re-reading them never sees
// half a file.
func WriteInternalCert(b *pki.Bundle, dir, name string, dns []string, ips []net.IP, ttl time.Duration) (certPath, keyPath string, err error) {
	certPEM, keyPEM, err := b.IssueInternal(name, dns, ips, ttl)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("create %s: %w", dir, err)
	}
	certPath, keyPath = filepath.Join(dir, InternalCertFile), filepath.Join(dir, InternalKeyFile)
	if err := writeFile(keyPath, keyPEM); err != nil {
		return "", "", err
	}
	if err := writeFile(certPath, certPEM); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}
