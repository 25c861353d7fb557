package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/feed"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/policy"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// EventsWatchPath is the event stream's route under basePath (GET,
// Server-Sent Events; docs/api.md, "events/watch").
const EventsWatchPath = "/events/watch"

// Limits of events.list and the event stream.
const (
	maxEventFilter    = 256 // bytes of a type prefix or subject
	maxStreamTypes    = 32  // prefixes in ?types=
	streamBatch       = 256 // events written per read of the feed
	defaultHeartbeat  = 15 * time.Second
	streamRetryMillis = 2000 // the SSE retry: field, for EventSource
	streamEventGap    = "gap"
	// streamEventRevoked ends a stream whose token was revoked or expired:
	// data {"code": "UNAUTHENTICATED", "message": why}.
	streamEventRevoked = "revoked"
)

// EventFeed is what the event stream reads: the process's outbox reader
// (package feed).
type EventFeed interface {
	Head(ctx context.Context) (int64, error)
	Next(ctx context.Context, after int64, limit int) ([]*feed.Event, error)
	Notify()
}

// typePrefix is a type filter as the outbox stores types: under
// events.TypePrefix when it lacks it.
func typePrefix(p string) string {
	if p == "" || strings.HasPrefix(p, events.TypePrefix) {
		return p
	}
	return events.TypePrefix + p
}

// eventsList pages through the outbox's events, newest first (docs/api.md,
// "events.list").
func (s *Server) eventsList(ctx context.Context, p *iam.Principal, r *apiv1.ListEventsRequest) (*apiv1.ListEventsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	q := store.OutboxQueryParams{Limit: lp.Limit, TopicPrefix: typePrefix(r.GetTypePrefix()), Key: r.GetSubject()}
	if q.BeforeID, err = idCursor(lp.Cursor); err != nil {
		return nil, err
	}
	if err := checkLengths(maxEventFilter, map[string]string{"typePrefix": r.GetTypePrefix(), "subject": r.GetSubject()}); err != nil {
		return nil, err
	}
	if q.Since, q.Until, err = timeWindow(r.GetSince(), r.GetUntil()); err != nil {
		return nil, err
	}
	entries, err := s.store.OutboxQuery(ctx, &q)
	if err != nil {
		return nil, err
	}
	// The cursor follows the page read, so a page a tenant's caller sees
	// may hold fewer events than the limit, and the next one still follows.
	out := &apiv1.ListEventsResponse{NextCursor: next(entries, lp, func(e *store.OutboxEntry) string { return idString(e.ID) })}
	scope := s.eventScope(p)
	for _, e := range entries {
		ev := &feed.Event{ID: e.ID, Type: e.Topic, Subject: e.Key, Time: e.CreatedAt,
			JSON: events.FromOutbox(e.ID, e.Topic, e.Key, e.Payload, e.CreatedAt)}
		if ok, err := scope.sees(ctx, ev.JSON); err != nil {
			return nil, err
		} else if ok {
			out.Events = append(out.Events, eventOut(ev))
		}
	}
	return out, nil
}

// eventOut is an event in the API's form.
func eventOut(e *feed.Event) *apiv1.Event {
	out := &apiv1.Event{Id: strconv.FormatInt(e.ID, 10), Type: e.Type, Subject: e.Subject, Time: ts(e.Time)}
	ce := &structpb.Struct{}
	if protojson.Unmarshal(e.JSON, ce) == nil {
		out.CloudEvent = ce
	}
	return out
}

// serveEventsWatch is GET {basePath}/events/watch: the outbox as
// Server-Sent Events for a viewer (or higher) token (docs/api.md,
// "events/watch"). Each event is "id: <outbox id>", "event: <type>" and
// "data: <CloudEvents JSON>"; a comment every heartbeat keeps proxies from
// closing an idle stream. The stream starts after Last-Event-ID (or
// ?after=), or at the newest event without either; ?types=a,b keeps the
// types that begin with one of the prefixes. A resume id older than
// retention is 410 GONE before the stream starts, or a "gap" event and the
// end of the stream once it runs: never a silent skip.
func (s *Server) serveEventsWatch(w http.ResponseWriter, r *http.Request) {
	addr := CallerAddr(r.Context())
	p, err := s.auth.Authenticate(r.Context(), bearerToken(r), addr)
	if err != nil {
		if reason := unauthenticatedReason(err); reason != "" {
			s.refuseUnauthenticated(r.Context(), reason, "events.watch", addr)
			w.Header().Set("WWW-Authenticate", `Bearer realm="better-compute"`)
			s.writeError(w, r, &Error{Code: apiv1.CodeUnauthenticated, Message: err.Error()})
			return
		}
		s.writeError(w, r, err)
		return
	}
	// The stream is events.list's, decided as it is (a policy may refuse
	// it, by the caller's address say).
	var res policy.Resource
	if err := s.tenantResource(r.Context(), p, p.TenantID, &res); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.decide(r.Context(), decision{p: p, addr: addr, action: "events.list", res: res, read: true}); err != nil {
		if e, ok := err.(*Error); ok && e.Code == apiv1.CodePermissionDenied && !iam.Allows(p.Role, store.RoleViewer) {
			e.Message = fmt.Sprintf("role %s may not watch events (needs viewer)", p.Role)
		}
		s.writeError(w, r, err)
		return
	}
	prefixes, e := streamTypes(r.URL.Query().Get("types"))
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if !s.streams.acquire(p.TokenID) {
		s.writeError(w, r, exhausted(streamsRetryAfter, "this token holds %d event streams, the most it may (host.limits.eventStreamsPerToken); close one first",
			s.streams.max))
		return
	}
	defer s.streams.release(p.TokenID)
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	// The stream ends when its token is revoked or expires (checkLive).
	defer s.live.add(&liveCall{tokenHash: sha256.Sum256([]byte(bearerToken(r))), addr: addr, tokenID: p.TokenID, cancel: cancel})()
	go func() {
		select {
		case <-s.stopping:
			cancel(nil)
		case <-ctx.Done():
		}
	}()
	cursor, resumed, e := streamCursor(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if resumed {
		// A resume id below the pruned mark is a gap even while the feed's
		// memory still holds what follows it: the answer does not depend on
		// which api process the watcher reached.
		newest, err := s.store.OutboxMaxID(ctx)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		pruned, err := s.store.OutboxPrunedThrough(ctx)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if cursor < pruned {
			gap := &feed.GapError{After: cursor, PrunedThrough: pruned}
			s.writeError(w, r, &Error{Code: apiv1.CodeGone, Field: "Last-Event-ID", Message: gap.Error()})
			return
		}
		// After a prune of every entry the newest id is the pruned mark.
		if newest = max(newest, pruned); cursor > newest {
			s.writeError(w, r, invalid("Last-Event-ID", "no event %d yet (the newest is %d)", cursor, newest))
			return
		}
	} else if cursor, err = s.feed.Head(ctx); err != nil {
		s.writeError(w, r, err)
		return
	}
	// The first read happens before the headers go out, so that a gap is
	// an HTTP status a client cannot miss.
	first, err := s.nextEvents(ctx, cursor, resumed)
	var gap *feed.GapError
	if errors.As(err, &gap) {
		s.writeError(w, r, &Error{Code: apiv1.CodeGone, Field: "Last-Event-ID", Message: gap.Error()})
		return
	}
	if err != nil && ctx.Err() == nil {
		s.writeError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	sw := &sseWriter{w: w, rc: rc}
	sw.printf("retry: %d\n: better-compute event stream after %d\n\n", streamRetryMillis, cursor)
	heartbeat := cmpDuration(s.cfg.EventHeartbeat, defaultHeartbeat)
	s.log.DebugContext(ctx, "Event stream opened", "token", p.TokenID, "after", cursor, "types", strings.Join(prefixes, ","))
	scope := s.eventScope(p) // a tenant's caller sees its subtree's events only
	for evs := first; sw.err == nil && ctx.Err() == nil; {
		var scopeErr error
		for _, ev := range evs {
			if !events.Matches(prefixes, ev.Type) {
				cursor = ev.ID
				continue
			}
			ok, err := scope.sees(ctx, ev.JSON)
			if err != nil {
				scopeErr = err // this event and those after it are read again below
				break
			}
			cursor = ev.ID
			if ok {
				sw.event(ev)
			}
		}
		if sw.flush(); sw.err != nil {
			break
		}
		if scopeErr != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "Event stream cannot read an event's tenant", logkey.Err, scopeErr)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		wait, stop := context.WithTimeout(ctx, heartbeat)
		evs, err = s.feed.Next(wait, cursor, streamBatch)
		stop()
		switch {
		case errors.As(err, &gap):
			b, _ := json.Marshal(map[string]any{"code": apiv1.CodeGone, "message": gap.Error(), "after": gap.After,
				"prunedThrough": gap.PrunedThrough})
			sw.printf("event: %s\ndata: %s\n\n", streamEventGap, b)
			sw.flush()
			return
		case err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			sw.printf(": heartbeat %s\n\n", time.Now().UTC().Format(time.RFC3339))
		case err != nil && ctx.Err() == nil:
			s.log.WarnContext(ctx, "Event stream cannot read the outbox", logkey.Err, err)
			sw.printf(": the outbox cannot be read now; retrying\n\n")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	if re := revokedCause(ctx); re != nil && sw.err == nil {
		// One last event says why, so the client stops rather than dial
		// again (client.Watch returns it as UNAUTHENTICATED).
		b, _ := json.Marshal(map[string]any{"code": apiv1.CodeUnauthenticated, "message": re.Reason})
		sw.printf("event: %s\ndata: %s\n\n", streamEventRevoked, b)
		sw.flush()
		s.log.InfoContext(ctx, "Event stream ended", "token", p.TokenID, "reason", re.Reason)
	}
}

// nextEvents is the stream's first read: what follows a resume id (which
// may be a gap), or nothing for a new watcher.
func (s *Server) nextEvents(ctx context.Context, cursor int64, resumed bool) ([]*feed.Event, error) {
	if !resumed {
		return nil, nil
	}
	wait, stop := context.WithTimeout(ctx, 10*time.Millisecond)
	defer stop()
	evs, err := s.feed.Next(wait, cursor, streamBatch)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, nil // nothing after the cursor yet
	}
	return evs, err
}

// streamCursor is the id a stream resumes after: Last-Event-ID (what an
// EventSource sends when it reconnects), else ?after=; resumed is false
// when neither is given.
func streamCursor(r *http.Request) (cursor int64, resumed bool, _ *Error) {
	field, v := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if v == "" {
		field, v = "after", r.URL.Query().Get("after")
	}
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, false, invalid(field, "%q is not an event id (a decimal outbox id)", v)
	}
	return n, true, nil
}

// streamTypes parses ?types=prefix,prefix.
func streamTypes(v string) ([]string, *Error) {
	if v == "" {
		return nil, nil
	}
	parts := strings.Split(v, ",")
	if len(parts) > maxStreamTypes {
		return nil, invalid("types", "at most %d prefixes", maxStreamTypes)
	}
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" || len(p) > maxEventFilter || strings.ContainsAny(p, "\r\n") {
			return nil, invalid("types", "want prefixes of 1 to %d bytes separated by commas, got %q", maxEventFilter, v)
		}
		parts[i] = p
	}
	return parts, nil
}

// cmpDuration is d, or def when d is not positive.
func cmpDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// sseWriter writes Server-Sent Events and remembers the first write error
// (the watcher went away).
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

func (s *sseWriter) printf(format string, args ...any) {
	if s.err == nil {
		_, s.err = fmt.Fprintf(s.w, format, args...)
	}
}

// event writes one event; the envelope is one line of JSON (json.Marshal
// escapes newlines inside strings), so one data: line carries it.
func (s *sseWriter) event(e *feed.Event) {
	data := e.JSON
	if bytes.ContainsAny(data, "\r\n") {
		var b bytes.Buffer
		if json.Compact(&b, data) == nil {
			data = b.Bytes()
		}
	}
	s.printf("id: %d\nevent: %s\ndata: %s\n\n", e.ID, e.Type, data)
}

func (s *sseWriter) flush() {
	if s.err == nil {
		s.err = s.rc.Flush()
	}
}
