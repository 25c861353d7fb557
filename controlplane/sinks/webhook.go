package sinks

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Webhook headers.
const (
	HeaderSignature = "X-Better-Compute-Signature" // "sha256=<hex>"
	HeaderTimestamp = "X-Better-Compute-Timestamp" // Unix seconds
	HeaderEventID   = "X-Better-Compute-Event-Id"  // the outbox id, for dedup
)

// Event is the JSON body a webhook receives for one outbox entry.
type Event struct {
	ID        int64           `json:"id"`
	Topic     string          `json:"topic"`
	Key       string          `json:"key,omitempty"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

func eventOf(e *store.OutboxEntry) Event {
	p := json.RawMessage(e.Payload)
	if len(p) == 0 {
		p = json.RawMessage("null")
	}
	return Event{ID: e.ID, Topic: e.Topic, Key: e.Key, Payload: p, CreatedAt: e.CreatedAt.UTC()}
}

// Sign returns the signature header value of body sent at ts: HMAC-SHA256
// over "<ts>.<body>" with secret, hex, prefixed "sha256=" (the timestamp
// is signed so a captured request cannot be replayed later unnoticed).
func Sign(secret []byte, ts int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "%d.", ts)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify checks a signature made by Sign; receivers use it.
func Verify(secret []byte, ts int64, body []byte, sig string) bool {
	return hmac.Equal([]byte(Sign(secret, ts, body)), []byte(sig))
}

// Webhook posts each entry as one signed JSON request.
type Webhook struct {
	// SinkName is the sink's name.
	SinkName string
	// URL receives POST requests.
	URL string
	// Secret signs them.
	Secret []byte
	// Timeout bounds one request. Defaults to 10 s.
	Timeout time.Duration
	// Client defaults to http.DefaultClient's transport with Timeout.
	Client *http.Client
	// Now is the clock for timestamps. Defaults to time.Now.
	Now func() time.Time
}

// Name names the sink.
func (w *Webhook) Name() string { return w.SinkName }

// Deliver posts the entries in order; a non-2xx answer is an error.
func (w *Webhook) Deliver(ctx context.Context, entries []*store.OutboxEntry) error {
	c := w.Client
	if c == nil {
		c = &http.Client{Timeout: cmp.Or(w.Timeout, 10*time.Second)}
	}
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	for _, e := range entries {
		body, err := json.Marshal(eventOf(e))
		if err != nil {
			return fmt.Errorf("encode outbox entry %d: %w", e.ID, err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
		if err != nil {
			return err
		}
		ts := now().Unix()
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
		req.Header.Set(HeaderEventID, strconv.FormatInt(e.ID, 10))
		req.Header.Set(HeaderSignature, Sign(w.Secret, ts, body))
		res, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("webhook %s: %w", w.SinkName, err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		res.Body.Close()
		if res.StatusCode/100 != 2 {
			return fmt.Errorf("webhook %s answered %s for entry %d", w.SinkName, res.Status, e.ID)
		}
	}
	return nil
}
