package bootstrap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// ServingCert is a serving certificate a Renewer keeps: its file names in
// the Renewer's folder.
type ServingCert struct {
	// Use names it in logs: "gateway" or "api".
	Use string
	// CertName and KeyName are the file names in RenewerConfig.Dir.
	CertName, KeyName string
}

// RenewerConfig configures a Renewer.
type RenewerConfig struct {
	// Store holds the sealed bundle, read again each round (a rotated
	// gateway CA issues the next certificate).
	Store Store
	// Secret is the deployment secret.
	Secret string
	// Dir is the folder of the files: DataDir/pki.
	Dir string
	// Certs are the certificates kept; at least one.
	Certs []ServingCert
	// Names returns the names each certificate holds, asked each round
	// (LocalNames of the public hosts: an interface that gained an address
	// gets a certificate naming it).
	Names func() Names
	// Interval is how often the files are checked. Defaults to 1 h: a
	// certificate is replaced 30 days before its end, so an hour is early
	// enough many times over.
	Interval time.Duration
	// Now is the clock the certificates' ends are judged by. Defaults to
	// time.Now.
	Now func() time.Time
	// Log receives what was issued and what failed. Required.
	Log *slog.Logger
}

// Renewer re-issues the serving certificates that serve issues for itself
// (the embedded default's gateway certificate, host.tls mode auto's API
// certificate) while serve runs, not only at start: each round, one that
// ends within 30 days, was issued by another bundle or names other names is
// issued again into the same files, keeping its key (EnsureServingCert).
// The gateway and the API re-read their files every 60 s
// (internal/certreload), so the new certificate is served within a minute,
// with no restart.
type Renewer struct {
	cfg RenewerConfig
}

// NewRenewer returns a Renewer; it fails without a store, folder,
// certificate, names or logger.
func NewRenewer(cfg RenewerConfig) (*Renewer, error) {
	cfg.Interval = cmp.Or(cfg.Interval, time.Hour)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch {
	case cfg.Store == nil || cfg.Dir == "" || len(cfg.Certs) == 0 || cfg.Names == nil || cfg.Log == nil:
		return nil, errors.New("serving certificate renewer: store, dir, certs, names and log are required")
	case cfg.Interval < 0:
		return nil, fmt.Errorf("serving certificate renewer: negative interval %s", cfg.Interval)
	}
	return &Renewer{cfg: cfg}, nil
}

// Round checks every certificate once and re-issues those due; it returns
// the files it wrote. A failure on one certificate does not stop the
// others; the errors are joined.
func (r *Renewer) Round(ctx context.Context) (issued []string, err error) {
	b, err := LoadBundle(ctx, r.cfg.Store, r.cfg.Secret)
	if err != nil {
		return nil, fmt.Errorf("renew serving certificates: %w", err)
	}
	names := r.cfg.Names()
	now := r.cfg.Now()
	var errs []error
	for _, c := range r.cfg.Certs {
		certFile, _, did, err := ensureServingCertAt(b, r.cfg.Dir, c.CertName, c.KeyName, names, now)
		if err != nil {
			errs = append(errs, fmt.Errorf("renew the %s certificate %s: %w", c.Use, filepath.Join(r.cfg.Dir, c.CertName), err))
			continue
		}
		if did {
			issued = append(issued, certFile)
			r.cfg.Log.InfoContext(ctx, "Serving certificate renewed", "use", c.Use, "cert", certFile, "names", names.String())
		}
	}
	return issued, errors.Join(errs...)
}

// Run runs a round every Interval until ctx ends; a failed round is
// logged and tried again at the next.
func (r *Renewer) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := r.Round(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Log.WarnContext(ctx, "Serving certificates not renewed; trying again at the next round", logkey.Err, err)
			}
		}
	}
}
