package plugin

import (
	"errors"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors returned by Host; match them with errors.Is. Each comes wrapped in
// an *Error naming the plugin and the operation.
var (
	// ErrNotFound reports a plugin name with no bcx-<name> executable in the
	// plugin directory.
	ErrNotFound = errors.New("no such plugin")
	// ErrUnavailable reports a plugin that could not be started, or that
	// was waiting out its restart backoff past the call's deadline.
	ErrUnavailable = errors.New("plugin unavailable")
	// ErrCrashed reports a plugin process that exited while the call was in
	// flight. The plugin is restarted; whether the BMC acted is unknown.
	ErrCrashed = errors.New("plugin exited during the call")
	// ErrTimeout reports a plugin that did not answer before the call's
	// deadline. A plugin that then fails its health check is restarted.
	ErrTimeout = errors.New("plugin did not answer in time")
	// ErrUnsupported reports a call the plugin cannot serve: it does not
	// announce the capability, or it reported ReasonUnsupported.
	ErrUnsupported = errors.New("not supported by the plugin")
	// ErrBMC reports an error the plugin returned for the BMC: Error.Reason
	// says which (ReasonAuthFailed, ReasonUnreachable, ...).
	ErrBMC = errors.New("bmc call failed")
	// ErrInvalid reports a request the plugin or the host refused as
	// malformed (ReasonInvalidRequest).
	ErrInvalid = errors.New("invalid plugin request")
	// ErrClosed reports a call after Close, or after Run returned.
	ErrClosed = errors.New("plugin host closed")
)

// Reason is why a plugin failed a call: the google.rpc.ErrorInfo reason of
// its status (plugin.proto).
type Reason string

// Reasons of bettercompute.plugin.v1.
const (
	ReasonInvalidRequest Reason = "INVALID_REQUEST"
	ReasonAuthFailed     Reason = "AUTH_FAILED"
	ReasonUnreachable    Reason = "UNREACHABLE"
	ReasonTimeout        Reason = "TIMEOUT"
	ReasonUnsupported    Reason = "UNSUPPORTED"
	ReasonBMCError       Reason = "BMC_ERROR"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of errors plugins report.
const ErrorDomain = "bettercompute.plugin.v1"

// code is the gRPC code plugin.proto pairs with r.
func (r Reason) code() codes.Code {
	switch r {
	case ReasonInvalidRequest:
		return codes.InvalidArgument
	case ReasonAuthFailed:
		return codes.Unauthenticated
	case ReasonUnreachable:
		return codes.Unavailable
	case ReasonTimeout:
		return codes.DeadlineExceeded
	case ReasonUnsupported:
		return codes.FailedPrecondition
	default:
		return codes.Unknown
	}
}

// StatusError is what a plugin returns for a failed call: a gRPC status with
// the code plugin.proto gives reason and an ErrorInfo detail carrying it. msg
// names the BMC and must hold no secret.
func StatusError(reason Reason, msg string) error {
	st := status.New(reason.code(), msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: string(reason), Domain: ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// reportedReason returns the reason a plugin put in st, and false when st
// did not come from a plugin (no ErrorInfo of ErrorDomain).
func reportedReason(st *status.Status) (Reason, bool) {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return Reason(info.GetReason()), true
		}
	}
	return "", false
}

// Error is the error Host returns for a failed call. Its text has every
// recent secret scrubbed.
type Error struct {
	// Plugin is the plugin's name, for example "ipmi".
	Plugin string
	// Op is the operation: "info", "health", "power", "boot" or "bmc.info".
	Op string
	// Reason is the plugin's reason for errors it reported (ErrBMC,
	// ErrUnsupported, ErrInvalid); empty for the host's own errors.
	Reason Reason
	// Message says what happened, without secrets.
	Message string

	kind error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("plugin ")
	b.WriteString(e.Plugin)
	// A plugin's own message names the BMC and the operation already.
	if e.Op != "" && e.Reason == "" {
		b.WriteString(": ")
		b.WriteString(e.Op)
	}
	b.WriteString(": ")
	b.WriteString(e.Message)
	return b.String()
}

// Unwrap returns the sentinel (ErrCrashed, ErrBMC, ...) the error is.
func (e *Error) Unwrap() error { return e.kind }
