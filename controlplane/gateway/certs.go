package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// certReloader serves the certificate in two PEM files and re-reads them
// periodically; a failed read keeps the certificate it has.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	cur               atomic.Pointer[tls.Certificate]
}

// load reads the files and, when they hold a different certificate, serves
// it from the next handshake on.
func (r *certReloader) load() error {
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

// get is tls.Config.GetCertificate.
func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// run returns the loop that re-reads the files every interval until ctx
// ends.
func (r *certReloader) run(interval time.Duration) func(context.Context) {
	return func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := r.load(); err != nil {
					r.log.WarnContext(ctx, "Serving certificate not reloaded; keeping the current one", "error", err)
				}
			}
		}
	}
}
