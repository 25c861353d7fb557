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
//  3. In one transaction: the token is consumed (store.JoinTokenConsume: known,
//     matching secret, not expired, not revoked, uses below max-uses, so
//     concurrent joins admit exactly max-uses); the node is found or made (a
//     machine of the token's pool with the same machine id, failing that the
//     same hostname, keeps its node id, labels and history: a reinstalled
//     machine); the certificate is issued and recorded on the node; a re-join
//     revokes the node's previous certificate serial; the audit row is
//     written.
//
// Every attempt, admitted or refused, leaves exactly one audit row with the
// caller's address. A refused join leaves nothing else: the transaction of
// step 3 rolls back and the refusal's audit row is written on its own.
//
// Refusals are errors wrapping ErrRefused together with the cause: one of the
// store's token errors (store.ErrTokenInvalid, ErrTokenExpired, ErrTokenRevoked,
// ErrTokenExhausted) or ErrTokenMalformed for a token that does not authorise
// the join, ErrInvalidRequest (with the pki error for a CSR) for a request that
// is malformed. Any other error is the system's fault, not the caller's.
package admission
