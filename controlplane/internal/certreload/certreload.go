// Package certreload serves a TLS certificate from two PEM files and
// re-reads them periodically, so that a certificate replaced on disk (pki
// issue-gateway, a re-issue at start, an operator's renewal) is served from
// the next handshake on without a restart. The gateway and the API use it.
package certreload

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// Reloader serves the certificate in two PEM files; a failed re-read keeps
// the certificate it has.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger
	cur               atomic.Pointer[tls.Certificate]
}

// New returns a Reloader of the files and loads them once; it fails when
// they do not hold a key pair.
func New(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: log}
	if err := r.Load(); err != nil {
		return nil, err
	}
	return r, nil
}

// Load reads the files and, when they hold a different certificate, serves
// it from the next handshake on.
func (r *Reloader) Load() error {
	c, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load serving certificate %s: %w", r.certFile, err)
	}
	if old := r.cur.Load(); old != nil && bytes.Equal(old.Certificate[0], c.Certificate[0]) {
		return nil
	}
	r.cur.Store(&c)
	if c.Leaf != nil {
		r.log.Info("Serving certificate loaded", "file", r.certFile, "not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// Current is the certificate served now.
func (r *Reloader) Current() *tls.Certificate { return r.cur.Load() }

// GetCertificate is tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// Run re-reads the files every interval until ctx ends.
func (r *Reloader) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := r.Load(); err != nil {
				r.log.WarnContext(ctx, "Serving certificate not reloaded; keeping the current one", logkey.Err, err)
			}
		}
	}
}
