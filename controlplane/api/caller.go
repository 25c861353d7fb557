package api

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientAddressHeaders are the headers through which a client could name its
// own address. They are removed before any handler sees the request; the
// caller's address is only ever the verified socket peer, or the right-most
// untrusted hop of X-Forwarded-For when the peer is a trusted proxy.
var clientAddressHeaders = []string{
	"X-Forwarded-For", "Forwarded", "X-Real-Ip", "X-Client-Ip", "True-Client-Ip",
	"Cf-Connecting-Ip", "Fastly-Client-Ip", "X-Cluster-Client-Ip", "X-Forwarded", "Forwarded-For",
	"X-Original-Forwarded-For",
}

type addrKey struct{}

// CallerAddr returns the verified caller address of a request.
func CallerAddr(ctx context.Context) netip.Addr {
	a, _ := ctx.Value(addrKey{}).(netip.Addr)
	return a
}

// callerAddress resolves the caller and strips client address headers.
type callerAddress struct {
	trusted []netip.Prefix
	next    http.Handler
}

func (c *callerAddress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	addr := c.resolve(r)
	for _, h := range clientAddressHeaders {
		r.Header.Del(h)
	}
	c.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), addrKey{}, addr)))
}

func (c *callerAddress) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// resolve walks X-Forwarded-For from the right while hops are trusted
// proxies; the first untrusted hop is the caller.
func (c *callerAddress) resolve(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	peer, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	peer = peer.Unmap()
	if !c.isTrusted(peer) {
		return peer
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	addr := peer
	for i := len(hops) - 1; i >= 0; i-- {
		hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			return addr // a malformed hop ends the walk at the last good one
		}
		addr = hop.Unmap()
		if !c.isTrusted(addr) {
			return addr
		}
	}
	return addr
}
