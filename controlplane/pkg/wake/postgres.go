package wake

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
)

// PGNotifier sends NOTIFY through a small pool of its own.
type PGNotifier struct {
	pool *pgxpool.Pool
}

// NewPGNotifier connects to url for sending notifications.
func NewPGNotifier(ctx context.Context, url string) (*PGNotifier, error) {
	cfg, _, err := postgres.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("wake: %w", err)
	}
	cfg.MaxConns = 2
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("wake: connect: %w", err)
	}
	return &PGNotifier{pool: p}, nil
}

// Notify sends one notification.
func (n *PGNotifier) Notify(ctx context.Context) error {
	_, err := n.pool.Exec(ctx, "SELECT pg_notify($1, '')", Channel)
	return err
}

// Close releases the pool.
func (n *PGNotifier) Close() { n.pool.Close() }

// Listen holds a connection to url (database.notifyURL, else database.url:
// a direct connection, since LISTEN needs a session that a transaction
// pooler does not keep) that LISTENs on Channel and wakes bus locally on
// every notification, reconnecting with backoff, until ctx ends.
func Listen(ctx context.Context, url string, bus *Bus, log *slog.Logger) error {
	return ListenChannels(ctx, url, map[string]*Bus{Channel: bus}, log)
}

// ListenChannels is Listen on several channels over one connection: a
// notification on a channel wakes its bus locally (the gateway's command
// wake-ups on Channel, the api's event feed on postgres.OutboxChannel).
// After a lost connection every bus is woken once, since something may
// have been missed while reconnecting.
func ListenChannels(ctx context.Context, url string, buses map[string]*Bus, log *slog.Logger) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, url, buses, func() { backoff = 100 * time.Millisecond })
		if ctx.Err() != nil {
			return nil
		}
		log.WarnContext(ctx, "Wake-up listener lost its connection", logkey.Err, err)
		for _, bus := range buses {
			bus.Local()
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff/2 + rand.N(backoff)):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
	return nil
}

func listenOnce(ctx context.Context, url string, buses map[string]*Bus, connected func()) error {
	cfg, _, err := postgres.ParseURL(url)
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for ch := range buses {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	connected()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if bus := buses[n.Channel]; bus != nil {
			bus.Local()
		}
	}
}
