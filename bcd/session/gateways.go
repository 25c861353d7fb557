package session

import (
	"context"
	"slices"
	"time"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
)

// GatewayKeep is how long a gateway that no Welcome lists any more stays in
// a node's list: a gateway gone (no row, or its lease expired) for longer
// than a day is dropped (DESIGN.md, "Gateways change"). The join-time list
// is never dropped: it is the last resort.
const GatewayKeep = 24 * time.Hour

// KnownGateway is a gateway a Welcome listed, and when it last did.
type KnownGateway struct {
	URL      string    `json:"url"`
	ListedAt time.Time `json:"listed_at"`
}

// MergeGateways returns the node's gateway list after a Welcome listed
// listed at now: the listed gateways first, in the gateway's order (it puts
// itself first), then those known before that were listed within keep of
// now, in their previous order. Duplicates and URLs that are not
// https://host[:port] are left out.
func MergeGateways(known []KnownGateway, listed []string, now time.Time, keep time.Duration) []KnownGateway {
	out := make([]KnownGateway, 0, len(listed)+len(known))
	seen := func(u string) bool {
		return slices.ContainsFunc(out, func(k KnownGateway) bool { return k.URL == u })
	}
	for _, u := range listed {
		if _, err := parseGatewayURL(u); err == nil && !seen(u) {
			out = append(out, KnownGateway{URL: u, ListedAt: now})
		}
	}
	for _, k := range known {
		if now.Sub(k.ListedAt) <= keep && !seen(k.URL) {
			out = append(out, k)
		}
	}
	// At most MaxGatewayList, the newest listed first.
	return out[:min(len(out), MaxGatewayList)]
}

// gatewayOrder is the order a Client tries gateways in: the known ones,
// then the join-time list (Config.Gateways) for those not among them.
func gatewayOrder(known []KnownGateway, joined []string) []string {
	urls := make([]string, 0, len(known)+len(joined))
	for _, k := range known {
		urls = append(urls, k.URL)
	}
	for _, u := range joined {
		if !slices.Contains(urls, u) {
			urls = append(urls, u)
		}
	}
	return urls
}

// listed takes the gateway list of a Welcome from gw: it merges it into the
// known list, persists that through Config.Identity (KeepGateways) when it changed (or
// its newest entry is an hour old), and makes it the order of the next
// attempts, starting over from gw. It runs on Run's goroutine, which alone
// reads the list.
func (c *Client) listed(ctx context.Context, gw gatewayAddr, urls []string) {
	// Only gateways of the configured transport: a Welcome cannot move a
	// node off (or onto) the WebSocket fallback.
	ws := IsWebSocketURL(c.cfg.Gateways[0])
	urls = slices.DeleteFunc(slices.Clone(urls), func(u string) bool { return IsWebSocketURL(u) != ws })
	if len(urls) == 0 {
		return
	}
	now := c.clock.Now()
	merged := MergeGateways(c.known, urls, now, GatewayKeep)
	changed := !slices.EqualFunc(merged, c.known, func(a, b KnownGateway) bool { return a.URL == b.URL }) ||
		len(c.known) == 0 || now.Sub(c.known[0].ListedAt) > time.Hour
	if !changed {
		return
	}
	order := gatewayOrder(merged, c.cfg.Gateways)
	gws := make([]gatewayAddr, 0, len(order))
	for _, u := range order {
		if g, err := parseGatewayURL(u); err == nil {
			gws = append(gws, g)
		}
	}
	c.known, c.gws = merged, gws
	c.next = max(slices.IndexFunc(gws, func(g gatewayAddr) bool { return g.addr == gw.addr }), 0)
	if err := c.cfg.Identity.KeepGateways(ctx, slices.Clone(merged)); err != nil {
		c.log.WarnContext(ctx, "Gateway list not saved; keeping it in memory", logkey.Err, err)
	}
	c.log.DebugContext(ctx, "Gateway list updated", attrGateway, gw.url, "gateways", order)
}
