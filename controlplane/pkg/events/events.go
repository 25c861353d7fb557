package events

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	eventsv1 "github.com/better-compute/better-compute/proto/events/v1"
)

// SpecVersion is the CloudEvents version of every envelope.
const SpecVersion = "1.0"

// Source is every event's source attribute: the control plane of this
// deployment, as a URI reference.
const Source = "/better-compute/control-plane"

// TypePrefix begins every event type: "com.better-compute.<object>.<what>".
const TypePrefix = eventsv1.TypePrefix

// ContentType is the datacontenttype of every event's data.
const ContentType = "application/json"

// BatchContentType is the media type of a JSON array of events (the
// CloudEvents JSON format's batched mode), as a webhook sink posts them.
const BatchContentType = "application/cloudevents-batch+json"

// Envelope is one CloudEvents 1.0 event in its JSON form. ID is unique per
// event ("evt_" and 26 base32 characters); Time is when the change
// committed's transaction ran, UTC, RFC 3339 with nanoseconds; Subject is
// the id of the object that changed; Data is the type's data struct as JSON.
type Envelope struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            time.Time       `json:"time"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
}

// New returns the envelope of an event of type typ about subject at now,
// with data encoded as JSON. It fails only when data does not encode.
func New(typ, subject string, data any, now time.Time) (*Envelope, error) {
	b, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("encode data of %s: %w", typ, err)
	}
	return &Envelope{SpecVersion: SpecVersion, ID: NewID(), Source: Source, Type: typ, Subject: subject,
		Time: now.UTC(), DataContentType: ContentType, Data: b}, nil
}

// NewID returns a new event id: "evt_" and 26 base32 characters (130 bits
// of randomness).
func NewID() string { return "evt_" + strings.ToLower(rand.Text()) }

// Marshal returns the envelope's JSON.
func (e *Envelope) Marshal() ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", e.ID, err)
	}
	return b, nil
}

// ErrInvalid is wrapped by Parse's refusals.
var ErrInvalid = errors.New("not a CloudEvents 1.0 event")

// Parse decodes an envelope and checks the attributes CloudEvents 1.0
// requires (specversion "1.0", non-empty id, source and type) and those
// this project always sets (time, and data as JSON when present).
func Parse(b []byte) (*Envelope, error) {
	var e Envelope
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case e.SpecVersion != SpecVersion:
		return nil, fmt.Errorf("%w: specversion %q, want %q", ErrInvalid, e.SpecVersion, SpecVersion)
	case e.ID == "":
		return nil, fmt.Errorf("%w: no id", ErrInvalid)
	case e.Source == "":
		return nil, fmt.Errorf("%w: no source", ErrInvalid)
	case e.Type == "":
		return nil, fmt.Errorf("%w: no type", ErrInvalid)
	case e.Time.IsZero():
		return nil, fmt.Errorf("%w: no time", ErrInvalid)
	}
	return &e, nil
}

// FromOutbox returns the CloudEvents JSON of an outbox row: its payload
// when that is an envelope already (every row this build writes), else an
// envelope wrapping it (rows an older build wrote, such as its batch-level
// "command.created"): id "outbox-<id>", type topic (under TypePrefix when
// it lacks it), subject key, time createdAt and data the payload.
func FromOutbox(id int64, topic, key string, payload []byte, createdAt time.Time) []byte {
	if bytes.Contains(payload, []byte(`"specversion"`)) {
		if _, err := Parse(payload); err == nil {
			return payload
		}
	}
	typ := topic
	if !strings.HasPrefix(typ, TypePrefix) {
		typ = TypePrefix + typ
	}
	data := json.RawMessage(payload)
	if !json.Valid(data) {
		data = nil
	}
	e := &Envelope{SpecVersion: SpecVersion, ID: "outbox-" + strconv.FormatInt(id, 10), Source: Source, Type: typ,
		Subject: key, Time: createdAt.UTC(), DataContentType: ContentType, Data: data}
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("encode envelope: %v", err)) // strings, a time and valid JSON always encode
	}
	return b
}

// Matches reports whether typ is selected by prefixes: every type when
// there are none, else those that begin with one of them. A prefix that does
// not begin with TypePrefix is read under it ("node." selects
// "com.better-compute.node.ready").
func Matches(prefixes []string, typ string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if !strings.HasPrefix(p, TypePrefix) {
			p = TypePrefix + p
		}
		if strings.HasPrefix(typ, p) {
			return true
		}
	}
	return false
}
