package doctor

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Fleet thresholds.
const (
	// HeadroomWarn is the share of a gateway's max streams in use at which
	// headroom warns; a full gateway (1.0) fails, since it refuses new
	// sessions.
	HeadroomWarn = 0.9
	// SilentAfter is how many heartbeat intervals a ready node may be
	// silent: node liveness marks it unreachable after as many.
	SilentAfter = 3
	// CertWarnWithin is how close to its end a node certificate warns.
	// Nodes renew two thirds into a 24-hour certificate, 8 h before its end.
	CertWarnWithin = 6 * time.Hour
)

// GatewayHeadroom compares each live gateway's sessions with its max
// streams (the gateways table, refreshed by each gateway every 5 s). A
// gateway is live when its row's heartbeat is newer than liveWithin before
// now and it is not draining. At HeadroomWarn of its streams it warns, when
// full it fails. With nodes but no live gateway it warns: no daemon can
// connect.
func GatewayHeadroom(gws []*store.Gateway, nodes int, now time.Time, liveWithin time.Duration) Result {
	var live []*store.Gateway
	for _, g := range gws {
		if !g.Draining && now.Sub(g.HeartbeatAt) <= liveWithin {
			live = append(live, g)
		}
	}
	if len(live) == 0 {
		if nodes > 0 {
			return result(IDGatewayHeadroom, Warn, fmt.Sprintf("no live gateway for %d node(s): run a process with the gateway role", nodes),
				fmt.Sprintf("%d gateway row(s), none fresh within %s", len(gws), liveWithin))
		}
		return result(IDGatewayHeadroom, OK, "no live gateway and no nodes yet")
	}
	worst, worstShare := live[0], -1.0
	var rows []string
	sessions, streams := 0, 0
	for _, g := range live {
		share := 1.0
		if g.MaxStreams > 0 {
			share = float64(g.Sessions) / float64(g.MaxStreams)
		}
		if share > worstShare {
			worst, worstShare = g, share
		}
		sessions += g.Sessions
		streams += g.MaxStreams
		rows = append(rows, fmt.Sprintf("%s %d/%d", g.ID, g.Sessions, g.MaxStreams))
	}
	detail := strings.Join(rows, ", ")
	pct := fmt.Sprintf("%d of %d streams (%.0f %%)", worst.Sessions, worst.MaxStreams, 100*worstShare)
	switch {
	case worstShare >= 1:
		return result(IDGatewayHeadroom, Fail, fmt.Sprintf("gateway %s is full, %s: it refuses new sessions; add a gateway or raise host.gateway.maxStreams", worst.ID, pct), detail)
	case worstShare >= HeadroomWarn:
		return result(IDGatewayHeadroom, Warn, fmt.Sprintf("gateway %s uses %s: add a gateway or raise host.gateway.maxStreams", worst.ID, pct), detail)
	}
	return result(IDGatewayHeadroom, OK, fmt.Sprintf("%d live gateway(s) hold %d of %d streams", len(live), sessions, streams), detail)
}

// Heartbeats counts ready nodes whose last heartbeat (last_seen_at) is older
// than SilentAfter heartbeat intervals before now. Node liveness should have
// marked them unreachable, so they mean the liveness reconciler is not
// running or gateways cannot write heartbeats.
func Heartbeats(nodes []*store.Node, interval time.Duration, now time.Time) Result {
	limit := SilentAfter * interval
	var silent []string
	var longest time.Duration
	ready := 0
	for _, n := range nodes {
		if n.State != store.NodeReady {
			continue
		}
		ready++
		seen := n.CreatedAt
		if n.LastSeenAt != nil {
			seen = *n.LastSeenAt
		}
		if quiet := now.Sub(seen); quiet > limit {
			silent = append(silent, n.ID)
			longest = max(longest, quiet)
		}
	}
	if len(silent) == 0 {
		return result(IDHeartbeats, OK, fmt.Sprintf("every ready node sent a heartbeat within %s", short(limit)), fmt.Sprintf("%d ready node(s)", ready))
	}
	return result(IDHeartbeats, Warn, fmt.Sprintf("%d ready node(s) silent for more than %s: node liveness is not marking them (controllers role) or gateways cannot write heartbeats", len(silent), short(limit)),
		fmt.Sprintf("silent: %s; the longest for %s", some(silent), longest.Round(time.Second)))
}

// OldDaemons compares each node's bcd version with the newest one seen
// (semantic versions, "v" optional; versions that do not parse, such as
// "dev", are left out) and warns about nodes running an older one.
func OldDaemons(nodes []*store.Node) Result {
	var newest semver
	byVersion := map[string]int{}
	parsed, unparsed := map[string]semver{}, 0
	for _, n := range nodes {
		v, ok := parseSemver(n.BCDVersion)
		if !ok {
			unparsed++
			continue
		}
		parsed[n.BCDVersion] = v
		byVersion[n.BCDVersion]++
		if newest.raw == "" || v.compare(newest) > 0 {
			newest = v
		}
	}
	if newest.raw == "" {
		return result(IDOldDaemons, OK, "no node reports a released bcd version", fmt.Sprintf("%d node(s) without a semantic version", unparsed))
	}
	old := 0
	var rows []string
	for _, raw := range sortedKeys(byVersion) {
		if parsed[raw].compare(newest) < 0 {
			old += byVersion[raw]
			rows = append(rows, fmt.Sprintf("%d on %s", byVersion[raw], raw))
		}
	}
	detail := fmt.Sprintf("newest %s", newest.raw)
	if unparsed > 0 {
		detail += fmt.Sprintf("; %d node(s) without a semantic version", unparsed)
	}
	if old == 0 {
		return result(IDOldDaemons, OK, "every node runs bcd "+newest.raw, detail)
	}
	slices.Sort(rows)
	return result(IDOldDaemons, Warn, fmt.Sprintf("%d node(s) run a bcd older than %s: upgrade them", old, newest.raw), strings.Join(rows, ", "), detail)
}

// ExpiringCerts checks node certificates (nodes.cert_not_after): any that
// has ended fails (the node cannot connect until it re-attests, which it does
// by itself within pki.reattestGrace once it reaches a gateway), any ending
// within warnWithin warns: its renewal, due at two thirds to five sixths of
// its life, did not happen. The doctor passes the smaller of CertWarnWithin
// and a sixth of host.gateway.nodeCertTTL.
func ExpiringCerts(nodes []*store.Node, now time.Time, warnWithin time.Duration) Result {
	var expired, expiring []string
	for _, n := range nodes {
		if n.CertNotAfter == nil {
			continue
		}
		switch left := n.CertNotAfter.Sub(now); {
		case left <= 0:
			expired = append(expired, n.ID)
		case left <= warnWithin:
			expiring = append(expiring, n.ID)
		}
	}
	var detail []string
	if len(expired) > 0 {
		detail = append(detail, "expired: "+some(expired))
	}
	if len(expiring) > 0 {
		detail = append(detail, "expiring: "+some(expiring))
	}
	switch {
	case len(expired) > 0:
		return result(IDExpiringCerts, Fail, fmt.Sprintf("%d node certificate(s) expired: each node re-attests by itself once it reaches a gateway, within pki.reattestGrace of the expiry; past that, better-compute nodes reinstall NODE", len(expired)), detail...)
	case len(expiring) > 0:
		return result(IDExpiringCerts, Warn, fmt.Sprintf("%d node certificate(s) end within %s: their renewal is overdue; run bcd doctor on them", len(expiring), short(warnWithin)), detail...)
	}
	return result(IDExpiringCerts, OK, fmt.Sprintf("no node certificate ends within %s", short(warnWithin)))
}
