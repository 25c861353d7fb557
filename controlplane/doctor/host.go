package doctor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
)

// BuiltinRoutes are the api role's routes outside basePath, which neither
// basePath nor a host route may shadow.
var BuiltinRoutes = []string{"/healthz", "/readyz", "/metrics", "/.well-known/better-compute", "/watch"}

// NotifierWait is how long the notifier check waits for its own
// notification once it is sent: on one server it arrives in about a
// millisecond.
const NotifierWait = 2 * time.Second

// notifierChannel is the channel the notifier check listens and notifies
// on, so that the check wakes no gateway.
const notifierChannel = "better_compute_doctor"

// errNotHeard reports that LISTEN succeeded and the notification never
// came.
var errNotHeard = errors.New("the notification did not arrive")

// Notifier checks how the API wakes gateways after it enqueues commands.
// On SQLite every role runs in one process and wake-ups stay in memory. On
// PostgreSQL it listens on a check channel the way a gateway does (on
// notifyURL, the database.notifyURL, or databaseURL without it), sends a
// NOTIFY through a pool on databaseURL the way the API does, and fails
// when the notification does not arrive within NotifierWait: through a
// transaction-pooling proxy (PgBouncer in transaction mode) LISTEN
// succeeds and then hears nothing, and every command waits for the
// gateways' 1-second loop.
func Notifier(ctx context.Context, dialect store.Dialect, databaseURL, notifyURL string) Result {
	if dialect != store.DialectPostgres {
		return result(IDGatewayNotifier, OK, "embedded SQLite: wake-ups stay in-process")
	}
	listenURL, listenKey := databaseURL, "database.url"
	if notifyURL != "" {
		listenURL, listenKey = notifyURL, "database.notifyURL"
	}
	ctx, cancel := context.WithTimeout(ctx, defaultCheckTimeout)
	defer cancel()
	rtt, err := notifyRoundTrip(ctx, listenURL, databaseURL)
	switch {
	case errors.Is(err, errNotHeard):
		return result(IDGatewayNotifier, Fail, fmt.Sprintf("LISTEN through %s succeeded but a NOTIFY through database.url did not arrive within %s: "+
			"a transaction-pooling proxy (PgBouncer in transaction mode) drops it, and gateways dispatch only on their 1-second loop; "+
			"set database.notifyURL (%s) to a direct connection to PostgreSQL", listenKey, NotifierWait, config.EnvDatabaseNotifyURL),
			"channel "+notifierChannel)
	case err != nil:
		return result(IDGatewayNotifier, Fail, fmt.Sprintf("LISTEN/NOTIFY round trip failed, so gateways dispatch only on their 1-second loop: "+
			"check database.url and database.notifyURL (%s) reach PostgreSQL", config.EnvDatabaseNotifyURL), err.Error())
	}
	return result(IDGatewayNotifier, OK, "PostgreSQL LISTEN/NOTIFY delivers wake-ups",
		fmt.Sprintf("round trip %s: LISTEN through %s, NOTIFY through database.url", rtt.Round(time.Microsecond), listenKey))
}

// notifyRoundTrip listens on notifierChannel at listenURL, sends one
// notification with a payload of its own through a pool on notifyURL, and
// waits NotifierWait for it; it fails wrapping errNotHeard when it does
// not come.
func notifyRoundTrip(ctx context.Context, listenURL, notifyURL string) (time.Duration, error) {
	lcfg, _, err := postgres.ParseURL(listenURL)
	if err != nil {
		return 0, fmt.Errorf("listen: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, lcfg.ConnConfig)
	if err != nil {
		return 0, fmt.Errorf("listen: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+notifierChannel); err != nil {
		return 0, fmt.Errorf("listen: %w", err)
	}
	cfg, _, err := postgres.ParseURL(notifyURL)
	if err != nil {
		return 0, fmt.Errorf("notify: %w", err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("notify: connect: %w", err)
	}
	defer pool.Close()
	payload := rand.Text()
	start := time.Now()
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, $2)", notifierChannel, payload); err != nil {
		return 0, fmt.Errorf("notify: %w", err)
	}
	wait, cancel := context.WithTimeout(ctx, NotifierWait)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wait)
		if err != nil {
			if wait.Err() != nil && ctx.Err() == nil {
				return 0, fmt.Errorf("%w within %s", errNotHeard, NotifierWait)
			}
			return 0, fmt.Errorf("wait for the notification: %w", err)
		}
		if n.Channel == notifierChannel && n.Payload == payload {
			return time.Since(start), nil
		}
	}
}

// Routes checks that basePath and the configured host routes shadow no
// built-in route and each other not at all: a route equal to or above
// another (a path prefix at a '/') would take its requests. The
// configuration has no host routes yet, so only basePath is checked.
func Routes(basePath string, routes []string) Result {
	owners := map[string]string{basePath: "basePath"}
	all := []string{basePath}
	for _, r := range routes {
		owners[r] = "host route " + r
		all = append(all, r)
	}
	for _, p := range all {
		for _, b := range BuiltinRoutes {
			if covers(p, b) || covers(b, p) {
				return result(IDRoutes, Fail, fmt.Sprintf("%s %s clashes with the built-in route %s: move it", owners[p], p, b))
			}
		}
	}
	for i, p := range routes {
		for _, q := range all[:i+1] {
			if covers(q, p) || covers(p, q) {
				return result(IDRoutes, Fail, fmt.Sprintf("host route %s clashes with %s %s: move it", p, owners[q], q))
			}
		}
	}
	if len(routes) == 0 {
		return result(IDRoutes, OK, "no host routes are configured; basePath "+basePath+" clashes with no built-in route")
	}
	return result(IDRoutes, OK, fmt.Sprintf("%d host routes clash with nothing", len(routes)), strings.Join(routes, ", "))
}

// covers reports whether path prefix p takes requests for q: p equals q or
// q lies under p/.
func covers(p, q string) bool {
	p = strings.TrimSuffix(p, "/")
	return p == q || strings.HasPrefix(q, p+"/") || p == ""
}
