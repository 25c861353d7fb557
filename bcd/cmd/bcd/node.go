package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/sdnotify"
	"github.com/better-compute/better-compute/bcd/session"
)

type nodeFlags struct {
	dataDir  string
	logLevel string
}

func newNodeCmd(e env) *cobra.Command {
	var f nodeFlags
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run the node agent: hold the session with the gateways",
		Long: `Node loads the identity bcd join wrote, connects to a gateway of the node's
region and holds the session: heartbeats, certificate renewal, reconnection
with backoff and failover, until SIGINT or SIGTERM. Under systemd it sends
READY=1 after the first session is established and WATCHDOG=1 pings when the
unit sets WatchdogSec=.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return node(cmd.Context(), e, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", identity.DefaultDir, "directory holding the node's identity")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

func node(ctx context.Context, e env, f *nodeFlags) error {
	log, err := newLogger(e.stderr, f.logLevel)
	if err != nil {
		return err
	}
	store := identity.NewStore(f.dataDir)
	id, err := store.Load()
	if errors.Is(err, identity.ErrNotJoined) {
		return fmt.Errorf("%w: no identity in %s: run bcd join first", identity.ErrNotJoined, store.Dir())
	}
	if err != nil {
		return err
	}
	log = log.With("node_id", id.NodeID)
	notify := sdnotify.New(log)

	client, err := session.New(session.Config{
		Gateways:   id.Gateways,
		Trust:      id.Trust(),
		Key:        id.Key,
		Chain:      id.Chain,
		RenewAfter: id.RenewAfter,
		// Called by one renewal at a time, so id is not shared.
		OnRenew: func(_ context.Context, r *session.Renewal) error {
			id.Renewed(r)
			return store.SaveRenewal(id)
		},
		BCDVersion: bcdVersion(),
		BootID:     readLine(bootIDFile),
		Heartbeat:  readings,
		OnEvent: func(ev session.Event) {
			switch ev.Kind {
			case session.EventConnected:
				notify.Ready()
				notify.Status("connected to " + ev.Gateway)
			case session.EventBackoff:
				notify.Status(fmt.Sprintf("reconnecting in %v", ev.Delay.Round(time.Millisecond)))
			}
		},
		Logger: log,
	})
	if err != nil {
		return err
	}
	trustedBy := "CA file"
	if id.GatewayPin != "" {
		trustedBy = "pin " + id.GatewayPin
	}
	log.InfoContext(ctx, "Starting node agent", "version", bcdVersion(), "spiffe_id", id.SPIFFEID,
		"gateways", id.Gateways, "gateway_trust", trustedBy, "cert_not_after", id.NotAfter())

	g, gctx := errgroup.WithContext(ctx)
	gctx, cancel := context.WithCancel(gctx)
	g.Go(func() error {
		defer cancel()
		return client.Run(gctx)
	})
	g.Go(func() error { return notify.Watchdog(gctx) })
	err = g.Wait()
	notify.Stopping()
	switch {
	case errors.Is(err, session.ErrRevoked):
		return fmt.Errorf("%w; join the machine again with a new join token (bcd join --force)", err)
	case err != nil:
		return err
	}
	log.InfoContext(ctx, "Node agent stopped")
	return nil
}
