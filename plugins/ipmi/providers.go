package ipmi

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/bmc-toolbox/bmclib/v2/providers/ipmitool"
	"github.com/bmc-toolbox/bmclib/v2/providers/redfish"
	"github.com/go-logr/logr"

	"github.com/better-compute/better-compute/plugins/internal/logkey"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// bmcConn is what the plugin uses of a bmclib provider connection; both
// ipmitool.Conn and redfish.Conn have it.
type bmcConn interface {
	PowerStateGet(ctx context.Context) (string, error)
	PowerSet(ctx context.Context, state string) (bool, error)
	BootDeviceSet(ctx context.Context, device string, persistent, efi bool) (bool, error)
	Close(ctx context.Context) error
}

// session is one provider's attempt at one call on one BMC.
type session struct {
	s        *Server
	t        *target
	provider pluginv1.Provider
	log      *slog.Logger
	conn     bmcConn // opened on first use by bmc
}

// closeTimeout bounds logging out of a Redfish session after a call.
const closeTimeout = 5 * time.Second

// bmc returns the session's bmclib connection, opening it on first use.
func (ss *session) bmc(ctx context.Context) (bmcConn, error) {
	if ss.conn != nil {
		return ss.conn, nil
	}
	logger := logr.FromSlogHandler(ss.log.Handler())
	t := ss.t
	switch ss.provider {
	case pluginv1.Provider_PROVIDER_IPMITOOL:
		if ss.s.ipmitool == "" {
			return nil, fmt.Errorf("ipmitool is not installed: %w", errUnsupported)
		}
		// bmclib runs ipmitool with -E and IPMITOOL_PASSWORD in its
		// environment, never the password in argv. Its Open only probes
		// the power state, so it is skipped: the call itself finds out.
		c, err := ipmitool.New(t.host, t.username, t.password,
			ipmitool.WithLogger(logger),
			ipmitool.WithPort(strconv.Itoa(t.ipmiPort)),
			ipmitool.WithCipherSuite(t.cipher),
			ipmitool.WithIpmitoolPath(ss.s.ipmitool))
		if err != nil {
			return nil, err
		}
		ss.conn = c
	case pluginv1.Provider_PROVIDER_REDFISH:
		c := redfish.New(t.host, t.username, t.password, logger,
			redfish.WithHttpClient(redfishHTTPClient(t)),
			redfish.WithPort(strconv.Itoa(t.rfPort)))
		if err := c.Open(ctx); err != nil {
			return nil, err
		}
		ss.conn = c
	default:
		return nil, fmt.Errorf("provider %v: %w", ss.provider, errUnsupported)
	}
	return ss.conn, nil
}

// close ends the session (a Redfish logout), whatever ctx the call had.
func (ss *session) close() {
	if ss.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := ss.conn.Close(ctx); err != nil {
		ss.log.Debug("BMC session close failed", logkey.Err, err)
	}
}

// each runs fn with each of t's providers in order until one succeeds,
// within t's timeout, each attempt getting an equal share of the time left.
// It returns the provider that succeeded, or the combined error of them
// all (a gRPC status for the host).
func (s *Server) each(ctx context.Context, t *target, op string, fn func(ctx context.Context, ss *session) error) (pluginv1.Provider, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	log := s.callLogger(t, op)
	var fails []failure
	for i, p := range t.providers {
		deadline, _ := ctx.Deadline()
		budget := time.Until(deadline) / time.Duration(len(t.providers)-i)
		start := time.Now()
		err := s.attempt(ctx, budget, &session{s: s, t: t, provider: p, log: log.With(keyProvider, providerNames[p])}, fn)
		if err == nil {
			log.Debug("BMC call done", keyProvider, providerNames[p], keyTook, time.Since(start))
			return p, nil
		}
		f := classify(p, err, budget)
		log.Info("BMC provider failed", keyProvider, providerNames[p], keyReason, string(f.reason), logkey.Err, f.detail, keyTook, time.Since(start))
		fails = append(fails, f)
		if ctx.Err() != nil && i+1 < len(t.providers) {
			for _, rest := range t.providers[i+1:] {
				fails = append(fails, failure{provider: rest, reason: f.reason, detail: "not tried: no time left"})
			}
			break
		}
	}
	return pluginv1.Provider_PROVIDER_UNSPECIFIED, combine(t, op, fails)
}

// attempt runs fn in a session under budget. It returns when budget runs
// out even if the provider does not (gofish requests do not all heed a
// context): the abandoned attempt ends on its HTTP client's timeout and
// logs out then.
func (s *Server) attempt(ctx context.Context, budget time.Duration, ss *session, fn func(ctx context.Context, ss *session) error) error {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		defer ss.close()
		done <- fn(ctx, ss)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
