// Package admission decides whether a machine may join the fleet and, when it
// may, makes it a node: the business logic of JoinService.Join, kept apart from
// gRPC so that the HTTP API can reuse it.
//
// A join is admitted in this order (DESIGN.md, "Join tokens"; issue 3):
//
//  1. The join token parses (package proto/jointoken) and the facts the
//     machine gives about itself are well-formed and within their limits.
//  2. The CSR parses, its signature verifies and its key is ECDSA P-256 or
//     Ed25519 (pki.Bundle.IssueNode makes these checks). Names it asks for are
//     ignored.
//  3. In one transaction: a Join repeated with the same token and key (found
//     by store.NodeFindByJoinKey) answers with that node and a fresh
//     certificate, checking the token (store.JoinTokenCheck) but using none
//     of it; otherwise the token is consumed (store.JoinTokenConsume: known,
//     matching secret, not expired, not revoked, uses below max-uses, so
//     concurrent joins admit exactly max-uses). The join takes an existing
//     node's id only when the token was made for it (nodes reinstall: the
//     node's previous certificate is revoked, reason "reinstall") or the
//     caller proved the node's current key (Request.Proven, checked by the
//     gateway: nothing is revoked). A hostname or machine id never matches:
//     such a join makes a new node and carries a warning. The certificate is
//     issued and recorded on the node with its key hash and token; the audit
//     row is written.
//
// Reattest renews an expired certificate on a proof of the node's latest key,
// within Config.ReattestGrace of its expiry (DESIGN.md, "Identity over time").
//
// Every attempt, admitted or refused, leaves one audit row with the caller's
// address, except the refusals anyone can cause without a good token (a
// malformed, unknown, expired, revoked or used-up token, an invalid request,
// a source over the gateway's Join rate: RefuseRateLimited): those are
// summarised in at most one row per source address and reason a minute
// (RefusalSummaryEvery), the row counting them ("refusals", "since") and
// describing the last. A refused join leaves nothing else: the transaction
// of step 3 rolls back and the refusal's audit row is written on its own.
//
// Refusals are errors wrapping ErrRefused together with the cause: ErrUnknownNode,
// ErrNotLatestKey, ErrNodeRevoked or ErrGracePassed for a proof or
// re-attestation, or one of the
// store's token errors (store.ErrTokenInvalid, ErrTokenExpired, ErrTokenRevoked,
// ErrTokenExhausted) or ErrTokenMalformed for a token that does not authorise
// the join, ErrInvalidRequest (with the pki error for a CSR) for a request that
// is malformed. Any other error is the system's fault, not the caller's.
package admission
