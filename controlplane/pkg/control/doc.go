// Package control is the internal control API between control-plane
// processes (proto/control/v1; DESIGN.md, "Tunnels, the internal control
// API and the WebSocket fallback"; docs/tunnels.md).
//
// Every gateway process serves it (Server) on host.gateway.internal.listen,
// default :8444, and advertises the address in its gateways row
// (store.Gateway.InternalAddress). The api (Client) finds the gateway that
// holds a node's session from the session row and calls only that gateway:
// Wake right after it commits the node's commands, Revoke right after a
// revocation. Both sides present certificates of the deployment's internal
// CA (pki issue-internal) and accept only peers whose certificate chains to
// it and names an internal SPIFFE ID of the trust domain
// (spiffe://<trust domain>/internal/<name>); the certificate files are
// re-read every 60 s, as the gateway's are.
//
// The internal API is a fast path, never the only one: a node without a
// session, a gateway without an internal address, or a call that fails falls
// back to the wake-up bus (LISTEN/NOTIFY), and the gateways' loops find every
// queued command and revocation without either.
package control
