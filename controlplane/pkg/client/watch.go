package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// WatchParams choose what Watch streams.
type WatchParams struct {
	// After, with Resume, starts the stream after this event id; without
	// Resume the stream starts at the newest event.
	After  int64
	Resume bool
	// Types keeps the event types that begin with one of these prefixes
	// ("node." is read as "com.better-compute.node."); none keeps all.
	Types []string
	// OnReconnect, when set, is told of each dropped connection before
	// Watch dials again.
	OnReconnect func(err error, after int64)
}

// WatchEvent is one event of the stream.
type WatchEvent struct {
	// ID is the outbox id: pass it as WatchParams.After to resume.
	ID int64
	// Type is the CloudEvents type.
	Type string
	// Data is the CloudEvents 1.0 envelope's JSON.
	Data []byte
}

// Watch streams GET {BaseURL}/events/watch (Server-Sent Events) and calls
// fn with each event in order. When the connection drops it dials again
// with Last-Event-ID set to the last event it passed to fn, waiting from
// 0.5 s up to 5 s between tries, so that fn sees every event once, in
// order. It ends when ctx ends (nil), when fn fails (fn's error), or when
// the server refuses the stream or ends it with a gap (an *Error: GONE when
// the events after the resume id were pruned, UNAUTHENTICATED,
// INVALID_ARGUMENT, ...), or ends it because the token was revoked or
// expired (a *RevokedError).
func (c *Client) Watch(ctx context.Context, p WatchParams, fn func(*WatchEvent) error) error {
	hc := &http.Client{}
	if c.HTTP != nil {
		copied := *c.HTTP
		copied.Timeout = 0 // the stream lives as long as ctx
		hc = &copied
	}
	after, resume := p.After, p.Resume
	backoff := 500 * time.Millisecond
	for {
		got, err := c.watchOnce(ctx, hc, after, resume, p.Types, func(e *WatchEvent) error {
			after, resume = e.ID, true
			return fn(e)
		})
		var apiErr *Error
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &apiErr) && apiErr.Status != 0 && apiErr.Status < 500:
			return err
		case errors.Is(err, ErrRevoked):
			return err
		}
		var cbErr callbackError
		if errors.As(err, &cbErr) {
			return cbErr.err
		}
		if got {
			backoff = 500 * time.Millisecond
		}
		if p.OnReconnect != nil {
			p.OnReconnect(err, after)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// callbackError wraps fn's error, so that Watch returns it rather than
// reconnecting.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// watchOnce runs one connection; got reports whether any event arrived.
func (c *Client) watchOnce(ctx context.Context, hc *http.Client, after int64, resume bool, types []string,
	fn func(*WatchEvent) error) (got bool, _ error) {
	q := url.Values{}
	if len(types) > 0 {
		q.Set("types", strings.Join(types, ","))
	}
	u := strings.TrimRight(c.BaseURL, "/") + "/events/watch"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err
	}
	r.Header.Set("Accept", "text/event-stream")
	if c.Token != "" {
		r.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if resume {
		r.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	}
	res, err := hc.Do(r)
	if err != nil {
		return false, fmt.Errorf("watch events: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return false, newError(res, b)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var ev WatchEvent
	var id, typ string
	var data []byte
	for sc.Scan() {
		line := sc.Text()
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch {
		case line == "":
			if typ == "gap" {
				e := &Error{Status: http.StatusGone, Code: apiv1.CodeGone}
				_ = json.Unmarshal(data, e)
				return got, e
			}
			if typ == "revoked" {
				// The token was revoked or expired: dialling again is
				// refused, so end with the server's one line.
				var e struct {
					Message string `json:"message"`
				}
				_ = json.Unmarshal(data, &e)
				return got, &RevokedError{Reason: e.Message}
			}
			if id != "" && data != nil {
				n, err := strconv.ParseInt(id, 10, 64)
				if err != nil {
					return got, fmt.Errorf("watch events: event id %q is not a number", id)
				}
				ev = WatchEvent{ID: n, Type: typ, Data: data}
				got = true
				if err := fn(&ev); err != nil {
					return got, callbackError{err}
				}
			}
			id, typ, data = "", "", nil
		case field == "": // a comment: a heartbeat
		case field == "id":
			id = value
		case field == "event":
			typ = value
		case field == "data":
			data = append(data, value...)
		}
	}
	if err := sc.Err(); err != nil {
		return got, fmt.Errorf("watch events: %w", err)
	}
	return got, fmt.Errorf("watch events: the server closed the stream")
}
