package doctor_test

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/doctor"
	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/nodestate"
)

func TestSession(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
	notAfter := now.Add(20 * time.Hour)
	base := nodestate.State{
		PID: os.Getpid(), UpdatedAt: now, Since: now.Add(-5 * time.Minute), Gateway: "https://gw-1.example.com:8443",
		LastError: "connection refused", LastErrorAt: now, CertNotAfter: notAfter, CertRenewAfter: notAfter.Add(-8 * time.Hour),
		ReattestGraceSeconds: 7 * 24 * 3600, ReattestGraceFrom: nodestate.GraceFromGateway, ReattestDeadline: notAfter.Add(7 * 24 * time.Hour),
	}
	for _, tc := range []struct {
		name   string
		edit   func(*nodestate.State)
		unlock bool
		at     time.Time
		st     doctor.Status
		hint   string
	}{
		{name: "connected", edit: func(s *nodestate.State) { s.Connected, s.SessionID = true, "sess-1" }, at: now, st: doctor.OK,
			hint: "connected to https://gw-1.example.com:8443 since 2025-06-01T09:55:00Z"},
		{name: "disconnected", at: now, st: doctor.Warn,
			hint: "disconnected since 2025-06-01T09:55:00Z: connection refused; certificate valid until 2025-06-02T06:00:00Z (20h0m left)"},
		{name: "expired, re-attestable", at: notAfter.Add(time.Hour), st: doctor.Warn, hint: "re-attestation has 6d23h left"},
		{name: "past the grace", at: notAfter.Add(8 * 24 * time.Hour), st: doctor.Fail, hint: "past its re-attestation grace"},
		{name: "not running", unlock: true, at: now, st: doctor.Warn, hint: "bcd node is not running (no bcd node holds the data directory lock"},
		{name: "process gone", edit: func(s *nodestate.State) { s.PID = math.MaxInt32 }, at: now, st: doctor.Warn, hint: "that wrote it is gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s := base
			if tc.edit != nil {
				tc.edit(&s)
			}
			if err := nodestate.Write(dir, &s); err != nil {
				t.Fatal(err)
			}
			release, err := identity.NewStore(dir).Lock()
			if err != nil {
				t.Fatal(err)
			}
			if tc.unlock {
				release()
			} else {
				defer release()
			}
			r := doctor.Session(dir, tc.at)
			want(t, r, doctor.IDSession, tc.st, tc.hint)
			if r.Target != nodestate.File || !strings.Contains(r.Detail, "re-attestation ") || !strings.Contains(r.Detail, "renew after ") {
				t.Errorf("target %q, detail %q", r.Target, r.Detail)
			}
		})
	}
	want(t, doctor.Session(t.TempDir(), now), doctor.IDSession, doctor.Warn, "bcd node has left no state here")
}
