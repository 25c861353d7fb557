package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Stable error codes (DESIGN.md, "api").
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
)

// Error is an API error: a stable code, a message for people and the
// request field at fault (protojson name), if any.
type Error struct {
	Code    string
	Message string
	Field   string
	// RetryAfter, with CodeResourceExhausted, is how long the caller
	// should wait before trying again (the Retry-After header, in whole
	// seconds, at least 1).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Field != "" {
		return e.Code + ": " + e.Field + ": " + e.Message
	}
	return e.Code + ": " + e.Message
}

// status is the HTTP status of a code.
func (e *Error) status() int {
	switch e.Code {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeConflict:
		return http.StatusConflict
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case CodeGone:
		return http.StatusGone
	case CodeResourceExhausted:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

func invalid(field, format string, args ...any) *Error {
	return &Error{Code: CodeInvalidArgument, Field: field, Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *Error {
	return &Error{Code: CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

// toAPIError maps an error to an API error; store errors keep their
// meaning, anything unknown is INTERNAL with no detail (the detail is
// logged, never sent).
func toAPIError(err error) (*Error, bool) {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e, true
	case errors.Is(err, store.ErrNotFound):
		return &Error{Code: CodeNotFound, Message: err.Error()}, true
	case errors.Is(err, store.ErrConflict):
		return &Error{Code: CodeConflict, Message: "already exists"}, true
	case errors.Is(err, store.ErrDiskFull):
		return &Error{Code: CodeUnavailable, Message: "database disk full: nothing was written; free space where the database keeps its files"}, true
	}
	return &Error{Code: CodeInternal, Message: "internal error"}, false
}
