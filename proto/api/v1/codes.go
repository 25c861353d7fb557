package apiv1

import "time"

// Error codes: the "code" of an operator API error body
// ({"code":...,"message":...,"field":...}; DESIGN.md, "api"). These
// constants are the one definition of the wire names; the API server, its
// Go client and the CLI refer to them.
const (
	CodeInvalidArgument  = "INVALID_ARGUMENT"
	CodeNotFound         = "NOT_FOUND"
	CodeUnauthenticated  = "UNAUTHENTICATED"
	CodePermissionDenied = "PERMISSION_DENIED"
	CodeConflict         = "CONFLICT"
	CodeUnavailable      = "UNAVAILABLE"
	// CodeResourceExhausted refuses a call over one of a caller's bounds
	// (event streams or calls in flight per token); 429 with Retry-After,
	// the seconds to wait before trying again.
	CodeResourceExhausted = "RESOURCE_EXHAUSTED"
	CodeInternal          = "INTERNAL"
	// CodeMethodNotAllowed answers an API method's path called with an
	// HTTP method other than POST (405, with "Allow: POST").
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	// CodeGone answers an event stream resume id older than the outbox's
	// retention: the events after it are partly gone (410).
	CodeGone = "GONE"
)

// ErrorCodes lists every error code, the registry the wire-name checks
// (tests/wirenames_test.go) and docs/api.md are held to.
var ErrorCodes = []string{
	CodeInvalidArgument, CodeNotFound, CodeUnauthenticated, CodePermissionDenied, CodeConflict,
	CodeUnavailable, CodeResourceExhausted, CodeInternal, CodeMethodNotAllowed, CodeGone,
}

// Limits of joinTokens.create and nodes.reinstall: a join token's life
// (DefaultJoinTokenTTL when the request gives none) and its uses.
const (
	DefaultJoinTokenTTL = 2 * time.Hour
	MinJoinTokenTTL     = time.Minute
	MaxJoinTokenTTL     = 30 * 24 * time.Hour
	MaxJoinTokenUses    = 100000
)

// DefaultAddNodeTTL is the life of a nodes.add token when the request
// gives none (MinJoinTokenTTL to MaxJoinTokenTTL otherwise).
const DefaultAddNodeTTL = time.Hour
