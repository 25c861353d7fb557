package agent_test

import (
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/agent"
	"github.com/better-compute/better-compute/bcd/nodestate"
)

// fakeNotifier records the status lines the agent sends.
type fakeNotifier struct{ lines chan string }

func (f *fakeNotifier) Status(line string) { f.lines <- line }

// nextLine returns the next status line that starts with prefix.
func (f *fakeNotifier) nextLine(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case l := <-f.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("no status line %q... within %v", prefix, wait)
			return ""
		}
	}
}

func TestStateFollowsTheSession(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n := &fakeNotifier{lines: make(chan string, 1024)}
	r := start(t, agent.Config{StateDir: dir, Notifier: n})

	n.nextLine(t, "connected to "+r.gw.URL+" since ")
	// The line is sent after the file is written.
	s, err := nodestate.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Connected || s.Gateway != r.gw.URL || s.SessionID == "" || s.CertNotAfter.IsZero() || s.CertRenewAfter.IsZero() {
		t.Fatalf("connected state %+v", s)
	}
	if s.ReattestGraceFrom != nodestate.GraceFromDefault || !s.ReattestDeadline.Equal(s.CertNotAfter.Add(nodestate.DefaultReattestGrace)) {
		t.Errorf("re-attestation: grace %v from %q, deadline %v", s.Grace(), s.ReattestGraceFrom, s.ReattestDeadline)
	}
	connectedSince := s.Since

	// The gateway goes away: the state flips with the error, and stays
	// disconnected (since the moment the session ended) through the failed
	// attempts that follow.
	r.gw.Close()
	line := n.nextLine(t, "disconnected since ")
	if !strings.Contains(line, "; certificate valid until "+s.CertNotAfter.UTC().Format(time.RFC3339)) {
		t.Errorf("status line %q lacks the certificate's expiry", line)
	}
	s, err = nodestate.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Connected || s.SessionID != "" || s.LastError == "" || s.LastErrorAt.IsZero() || s.Since.Before(connectedSince) {
		t.Fatalf("disconnected state %+v", s)
	}
	if want := "disconnected since " + s.Since.UTC().Format(time.RFC3339) + ": "; !strings.HasPrefix(line, want) {
		t.Errorf("status line %q, want it to start %q", line, want)
	}
	since, firstErr := s.Since, s.LastErrorAt
	deadline := time.Now().Add(wait)
	for {
		s, err = nodestate.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		if s.LastErrorAt.After(firstErr) { // a later failed attempt was recorded
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed attempt recorded after the disconnect: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s.Connected || !s.Since.Equal(since) {
		t.Errorf("after a failed attempt: connected %v since %v, want disconnected since %v", s.Connected, s.Since, since)
	}

	// Stopping records that it stopped.
	r.shutdown(t)
	s, err = nodestate.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Connected || s.LastError != "bcd node stopped" {
		t.Errorf("stopped state %+v", s)
	}
}
