package sinks

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Webhook headers.
const (
	HeaderSignature = "X-Better-Compute-Signature" // "sha256=<hex>"
	HeaderTimestamp = "X-Better-Compute-Timestamp" // Unix seconds
)

// envelope returns an entry's CloudEvents JSON (events.FromOutbox).
func envelope(e *store.OutboxEntry) []byte {
	return events.FromOutbox(e.ID, e.Topic, e.Key, e.Payload, e.CreatedAt)
}

// Batch returns the body a webhook receives for entries: a JSON array of
// their CloudEvents envelopes, in outbox order (the CloudEvents JSON
// format's batched mode, events.BatchContentType).
func Batch(entries []*store.OutboxEntry) []byte {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(envelope(e))
	}
	b.WriteByte(']')
	return b.Bytes()
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

// Webhook posts each batch of entries as one signed request: Content-Type
// application/cloudevents-batch+json, the body a JSON array of CloudEvents
// envelopes (Batch).
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

// Deliver posts the entries in one request; a non-2xx answer is an error.
func (w *Webhook) Deliver(ctx context.Context, entries []*store.OutboxEntry) error {
	c := w.Client
	if c == nil {
		c = &http.Client{Timeout: cmp.Or(w.Timeout, 10*time.Second)}
	}
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	body := Batch(entries)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook %s: %w", w.SinkName, err)
	}
	ts := now().Unix()
	req.Header.Set("Content-Type", events.BatchContentType)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, Sign(w.Secret, ts, body))
	res, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("webhook %s: %w", w.SinkName, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("webhook %s answered %s for outbox entries %d to %d", w.SinkName, res.Status,
			entries[0].ID, entries[len(entries)-1].ID)
	}
	return nil
}
