package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/wake"
)

// BuiltinRoutes are the api role's routes outside basePath, which neither
// basePath nor a host route may shadow.
var BuiltinRoutes = []string{"/healthz", "/readyz", "/metrics", "/.well-known/better-compute"}

// Notifier checks how the API wakes gateways after it enqueues commands.
// On SQLite every role runs in one process and wake-ups stay in memory. On
// PostgreSQL it listens on the wake channel on one connection, notifies
// through the API's own notifier on another, and waits for the notification:
// a transaction-pooling proxy between the processes and PostgreSQL (such as
// PgBouncer in transaction mode) loses it. Without wake-ups gateways still
// dispatch from their 1-second loop, so a failure warns.
func Notifier(ctx context.Context, dialect store.Dialect, databaseURL string) Result {
	if dialect != store.DialectPostgres {
		return result(IDGatewayNotifier, OK, "embedded SQLite: wake-ups stay in-process")
	}
	ctx, cancel := context.WithTimeout(ctx, defaultCheckTimeout)
	defer cancel()
	start := time.Now()
	rtt, err := notifyRoundTrip(ctx, databaseURL)
	if err != nil {
		return result(IDGatewayNotifier, Warn, "LISTEN/NOTIFY does not reach back: gateways dispatch only on their 1-second loop; connect to PostgreSQL directly or through a session-pooling proxy",
			err.Error(), fmt.Sprintf("after %s", time.Since(start).Round(time.Millisecond)))
	}
	return result(IDGatewayNotifier, OK, "PostgreSQL LISTEN/NOTIFY delivers wake-ups", fmt.Sprintf("round trip %s on channel %s", rtt.Round(time.Microsecond), wake.Channel))
}

// notifyRoundTrip listens on wake.Channel, notifies it and waits.
func notifyRoundTrip(ctx context.Context, url string) (time.Duration, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, fmt.Errorf("listen: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+wake.Channel); err != nil {
		return 0, fmt.Errorf("listen: %w", err)
	}
	n, err := wake.NewPGNotifier(ctx, url)
	if err != nil {
		return 0, err
	}
	defer n.Close()
	start := time.Now()
	if err := n.Notify(ctx); err != nil {
		return 0, fmt.Errorf("notify: %w", err)
	}
	if _, err := conn.WaitForNotification(ctx); err != nil {
		return 0, fmt.Errorf("wait for the notification: %w", err)
	}
	return time.Since(start), nil
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
