package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Error is an API error: a stable code, a message for people and the
// request field at fault (protojson name), if any.
type Error struct {
	Code    string
	Message string
	Field   string
	// RetryAfter, with apiv1.CodeResourceExhausted, is how long the caller
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
	case apiv1.CodeInvalidArgument:
		return http.StatusBadRequest
	case apiv1.CodeNotFound:
		return http.StatusNotFound
	case apiv1.CodeUnauthenticated:
		return http.StatusUnauthorized
	case apiv1.CodePermissionDenied:
		return http.StatusForbidden
	case apiv1.CodeConflict:
		return http.StatusConflict
	case apiv1.CodeUnavailable:
		return http.StatusServiceUnavailable
	case apiv1.CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case apiv1.CodeGone:
		return http.StatusGone
	case apiv1.CodeResourceExhausted:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

func invalid(field, format string, args ...any) *Error {
	return &Error{Code: apiv1.CodeInvalidArgument, Field: field, Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *Error {
	return &Error{Code: apiv1.CodeNotFound, Message: fmt.Sprintf(format, args...)}
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
		return &Error{Code: apiv1.CodeNotFound, Message: err.Error()}, true
	case errors.Is(err, store.ErrConflict):
		return &Error{Code: apiv1.CodeConflict, Message: "already exists"}, true
	case errors.Is(err, store.ErrUnavailable):
		return &Error{Code: apiv1.CodeUnavailable, Message: "the database cannot be reached now (a failover or a restart): try again, with the same idempotencyKey where the method takes one"}, true
	case errors.Is(err, store.ErrDiskFull):
		return &Error{Code: apiv1.CodeUnavailable, Message: "database disk full: nothing was written; free space where the database keeps its files"}, true
	}
	return &Error{Code: apiv1.CodeInternal, Message: "internal error"}, false
}
