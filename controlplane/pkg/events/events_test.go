package events_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
)

// TestEnvelopeRequiredAttributes checks New's envelope against the
// CloudEvents 1.0 JSON format: the required attributes specversion, id,
// source and type as non-empty strings, and the optional ones this project
// sets (subject, time as RFC 3339, datacontenttype, data as a JSON object).
func TestEnvelopeRequiredAttributes(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 123456000, time.FixedZone("x", 3600))
	env, err := events.New(events.NodeReady, "node_a", events.NodeData{NodeID: "node_a", State: "ready"}, now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"specversion": "1.0", "source": "/better-compute/control-plane",
		"type": "com.better-compute.node.ready", "subject": "node_a", "datacontenttype": "application/json",
		"time": "2026-12-01T09:00:00.123456Z"} {
		if m[k] != want {
			t.Errorf("%s = %v, want %q", k, m[k], want)
		}
	}
	if id, _ := m["id"].(string); !strings.HasPrefix(id, "evt_") || len(id) != 30 {
		t.Errorf("id = %v, want evt_ and 26 characters", m["id"])
	}
	if d, ok := m["data"].(map[string]any); !ok || d["nodeId"] != "node_a" {
		t.Errorf("data = %v", m["data"])
	}
	for k := range m {
		if !strings.Contains("specversion id source type subject time datacontenttype data", k) {
			t.Errorf("unexpected attribute %q", k)
		}
	}
	if _, err := events.Parse(b); err != nil {
		t.Fatal(err)
	}
	other, _ := events.New(events.NodeReady, "node_a", nil, now)
	if other.ID == env.ID {
		t.Fatal("two events share an id")
	}
}

func TestParseRefusesWhatIsNotAnEvent(t *testing.T) {
	for _, s := range []string{`{}`, `[]`, `{"specversion":"0.3","id":"a","source":"s","type":"t","time":"2026-01-01T00:00:00Z"}`,
		`{"specversion":"1.0","source":"s","type":"t","time":"2026-01-01T00:00:00Z"}`,
		`{"specversion":"1.0","id":"a","type":"t","time":"2026-01-01T00:00:00Z"}`,
		`{"specversion":"1.0","id":"a","source":"s","time":"2026-01-01T00:00:00Z"}`,
		`{"specversion":"1.0","id":"a","source":"s","type":"t"}`} {
		if _, err := events.Parse([]byte(s)); err == nil {
			t.Errorf("Parse(%s) accepted it", s)
		}
	}
}

func TestFromOutbox(t *testing.T) {
	env, _ := events.New(events.TokenCreated, "tok", events.TokenData{TokenID: "tok"}, time.Now())
	b, _ := env.Marshal()
	if got := events.FromOutbox(7, env.Type, "tok", b, time.Now()); string(got) != string(b) {
		t.Fatalf("an envelope is not passed as it is: %s", got)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	got, err := events.Parse(events.FromOutbox(7, "command.created", "batch_1", []byte(`{"commands":3}`), at))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "outbox-7" || got.Type != "com.better-compute.command.created" || got.Subject != "batch_1" ||
		!got.Time.Equal(at) || string(got.Data) != `{"commands":3}` {
		t.Fatalf("wrapped legacy row = %+v", got)
	}
}

func TestMatches(t *testing.T) {
	for _, c := range []struct {
		prefixes []string
		typ      string
		want     bool
	}{
		{nil, events.NodeReady, true},
		{[]string{"node."}, events.NodeReady, true},
		{[]string{"node.ready"}, events.NodeReady, true},
		{[]string{"node."}, events.GPUHealthChanged, false},
		{[]string{"com.better-compute.gpu."}, events.GPUHealthChanged, true},
		{[]string{"command.", "gpu."}, events.GPUHealthChanged, true},
		{[]string{"join-token."}, events.TokenCreated, false},
	} {
		if got := events.Matches(c.prefixes, c.typ); got != c.want {
			t.Errorf("Matches(%v, %s) = %v", c.prefixes, c.typ, got)
		}
	}
}
