package api

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Bounds on what one caller can hold (issue 28; docs/configuration.md,
// host.limits). Kubernetes' API server caps in-flight requests and answers
// 429 with Retry-After; these are the same idea per token.
const (
	// DefaultEventStreamsPerToken is how many event streams
	// (events/watch) one token may hold open at once.
	DefaultEventStreamsPerToken = 16
	// DefaultInFlightPerToken is how many API calls one token may have
	// in flight at once (event streams are counted apart).
	DefaultInFlightPerToken = 64
	// DefaultBodyReadTimeout is how long a request's whole body may take
	// to arrive, counted from the end of its headers.
	DefaultBodyReadTimeout = 30 * time.Second
	// MaxIDBytes is the longest id a caller may name or set (bytes).
	MaxIDBytes = 128
	// MaxNoteBytes is the longest description, note or reason a caller
	// may set (bytes).
	MaxNoteBytes = 1 << 10
)

// Retry-After hints of the RESOURCE_EXHAUSTED refusals: an in-flight call
// ends in about a second; a stream is held until its watcher leaves.
const (
	inFlightRetryAfter = time.Second
	streamsRetryAfter  = 10 * time.Second
)

// holdings counts what each token holds at once (event streams, calls in
// flight) against a cap.
type holdings struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

func newHoldings(max int) *holdings { return &holdings{max: max, n: map[string]int{}} }

// acquire takes one for token; false when token already holds max.
func (h *holdings) acquire(token string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n[token] >= h.max {
		return false
	}
	h.n[token]++
	return true
}

// release gives back one that acquire took.
func (h *holdings) release(token string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n[token]--; h.n[token] <= 0 {
		delete(h.n, token)
	}
}

// exhausted is the RESOURCE_EXHAUSTED refusal of a caller over a per-token
// bound.
func exhausted(retryAfter time.Duration, format string, args ...any) *Error {
	return &Error{Code: apiv1.CodeResourceExhausted, Message: fmt.Sprintf(format, args...), RetryAfter: retryAfter}
}

// bodyDeadline bounds how long a request's body may take to arrive: a
// request with a body gets a read deadline of timeout from now, which
// decode clears once it has read the whole body (so a long call is not
// cut by its own connection's deadline). A body still arriving at the
// deadline fails its read (decode answers INVALID_ARGUMENT) and the
// connection is closed; a handler that never reads the body leaves the
// deadline to bound net/http's discard of it. Requests without a body
// (event streams, tunnels, downloads) are untouched.
func bodyDeadline(timeout time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			// ErrNotSupported (a ResponseWriter that is not a
			// connection's) leaves the request unbounded, as before.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(timeout))
		}
		next.ServeHTTP(w, r)
	})
}

// isTimeout reports a read that failed on its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
