package gpu

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
)

// TestXIDHealthTableMatchesDoc keeps the resolution → health table in
// doc.go and xidHealth in step.
func TestXIDHealthTableMatchesDoc(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	table, _, _ := strings.Cut(string(doc), "An XID that changes health")
	_, table, _ = strings.Cut(table, "health while it holds")
	row := regexp.MustCompile(`(?m)^//\t([A-Z_, ]+?) {2,}(ok|failed|degraded)\b`)
	rows := row.FindAllStringSubmatch(table, -1)
	if len(rows) != 3 {
		t.Fatalf("found %d resolution rows in doc.go, want 3", len(rows))
	}
	for _, r := range rows {
		for res := range strings.SplitSeq(r[1], ", ") {
			if got := xidHealth(res); string(got) != r[2] {
				t.Errorf("%s: code says %s, doc.go says %s", res, got, r[2])
			}
		}
	}
	for _, res := range []string{xid.ContactSupport, "CHECK_MECHANICALS", "UPDATE_SWFW", "SOMETHING_NEW"} {
		if got := xidHealth(res); got != HealthDegraded {
			t.Errorf("%s: %s, want degraded", res, got)
		}
	}
}

// The strongest resolution wins, ESCALATE above all, and the most recent
// XID is named.
func TestAssessResolutionAndLatestXID(t *testing.T) {
	t.Parallel()
	c, err := xid.Load()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	st := newState()
	st.xids[95] = seenXID{entry: c.Classify(95), at: now.Add(-time.Minute)}
	st.xids[79] = seenXID{entry: c.Classify(79), at: now}
	pending := true
	g := GPU{RetiredPages: &RetiredPages{Pending: &pending}}
	assess(&g, nil, st, assessParams{now: now, correctedSpike: 100, nvlinkWindow: time.Minute, nvlinkThreshold: 10})
	if g.Health != HealthFailed || g.Resolution != xid.RestartBM || g.XID != 79 ||
		g.XIDMnemonic != "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" || len(g.HealthReasons) != 3 {
		t.Errorf("assessed %+v", g)
	}
	st.xids[48] = seenXID{entry: c.Classify(48), at: now.Add(-time.Hour)}
	assess(&g, nil, st, assessParams{now: now, correctedSpike: 100, nvlinkWindow: time.Minute, nvlinkThreshold: 10})
	if g.Resolution != xid.Escalate || g.XID != 79 {
		t.Errorf("with XID 48: resolution %s, xid %d; want ESCALATE, 79", g.Resolution, g.XID)
	}
	ok := GPU{}
	assess(&ok, nil, newState(), assessParams{now: now})
	if ok.Health != HealthOK || ok.Resolution != "" || ok.XID != 0 || ok.HealthReasons != nil {
		t.Errorf("a GPU without findings: %+v", ok)
	}
}

// NVLink totals are judged by their rise within the window; a fall starts
// the window again.
func TestNVLinkDelta(t *testing.T) {
	t.Parallel()
	st := newState()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	p := func(at time.Duration) assessParams {
		return assessParams{now: t0.Add(at), nvlinkWindow: 10 * time.Minute}
	}
	for _, step := range []struct {
		at    time.Duration
		total uint64
		want  uint64
	}{
		{0, 1000, 0},
		{5 * time.Minute, 1040, 40},
		{10 * time.Minute, 1090, 90}, // baseline still t0 (exactly the window)
		{15 * time.Minute, 1100, 60}, // baseline the 5-minute reading
		{30 * time.Minute, 1100, 0},  // quiet
		{31 * time.Minute, 5, 0},     // counters fell: driver reloaded
		{32 * time.Minute, 305, 300}, // rising again from the new start
		{60 * time.Minute, 305, 0},
	} {
		got, ok := st.nvlinkDelta(&NVLinkErrors{Replay: step.total}, p(step.at))
		if !ok || got != step.want {
			t.Errorf("at %v total %d: delta %d, want %d", step.at, step.total, got, step.want)
		}
	}
	if _, ok := st.nvlinkDelta(nil, p(time.Hour)); ok || st.nvlink != nil {
		t.Error("a GPU without NVLink readings has a delta")
	}
}
