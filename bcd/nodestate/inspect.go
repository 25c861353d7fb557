package nodestate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/bcd/identity"
)

// Report is a State judged at a moment: whether its writer still runs and
// the time left on the certificate and for re-attestation. Its JSON form is
// the State's fields plus the ones below, in one object (`bcd status -o
// json`).
type Report struct {
	State
	// Now is the moment of the judgement, by this machine's clock.
	Now time.Time `json:"now"`
	// GatewayNow is Now by the gateway's clock: Now − ClockSkewSeconds.
	// The certificate and re-attestation are judged by it, as the gateway
	// judges them (DESIGN.md, "Identity over time", Clocks).
	GatewayNow time.Time `json:"gateway_now"`
	// Running reports whether the bcd node that wrote the state still runs.
	Running bool `json:"running"`
	// NotRunning says why Running is false; empty when it is true.
	NotRunning string `json:"not_running,omitempty"`
	// CertLeftSeconds is CertNotAfter − GatewayNow in whole seconds; negative
	// once the certificate has expired.
	CertLeftSeconds int64 `json:"cert_left_seconds"`
	// ReattestLeftSeconds is ReattestDeadline − GatewayNow in whole seconds:
	// how long after an outage re-attestation can still bring the node
	// back; negative once the deadline has passed.
	ReattestLeftSeconds int64 `json:"reattest_left_seconds"`
}

// Inspect reads the state file in dir and judges it at now, this
// machine's time: the certificate by the gateway's time, now less the
// skew bcd node last measured. It fails with ErrNoState when there is
// none.
func Inspect(dir string, now time.Time) (*Report, error) {
	s, err := Read(dir)
	if err != nil {
		return nil, err
	}
	r := &Report{State: *s, Now: now, GatewayNow: now.Add(-s.Skew())}
	r.NotRunning = notRunning(dir, s.PID)
	r.Running = r.NotRunning == ""
	r.CertLeftSeconds = int64(s.CertNotAfter.Sub(r.GatewayNow) / time.Second)
	r.ReattestLeftSeconds = int64(s.ReattestDeadline.Sub(r.GatewayNow) / time.Second)
	return r, nil
}

// Healthy reports whether the node runs and holds a session.
func (r *Report) Healthy() bool { return r.Running && r.Connected }

// CertificateSummary says when the certificate ends and how long that is
// from GatewayNow: "2025-06-01T10:00:00Z (23h59m left)" or "... (expired
// 2h ago)".
func (r *Report) CertificateSummary() string {
	return stamp(r.CertNotAfter) + " (" + left(r.CertNotAfter.Sub(r.GatewayNow), "expired") + ")"
}

// ClockSummary says how this machine's clock stands against the gateway's
// as bcd node last measured it: "agrees with the gateway's (within 1m)",
// or "172800 s ahead of the gateway's: certificates are judged by the
// gateway's time; fix the clock (NTP)".
func (r *Report) ClockSummary() string {
	s := r.ClockSkewSeconds
	switch {
	case s > 0:
		return fmt.Sprintf("%d s ahead of the gateway's: certificates are judged by the gateway's time; fix the clock (NTP)", s)
	case s < 0:
		return fmt.Sprintf("%d s behind the gateway's: certificates are judged by the gateway's time; fix the clock (NTP)", -s)
	}
	return "agrees with the gateway's (within 1m), or not measured yet"
}

// ReattestSummary says how long re-attestation can still bring the node
// back, until when, and where the grace came from: "6d23h left (until
// ...; grace 7d, assumed: ...)".
func (r *Report) ReattestSummary() string {
	if r.ReattestGraceSeconds == 0 && r.ReattestGraceFrom == GraceFromGateway {
		return "off (the gateway's grace is 0): an expired certificate needs a new join"
	}
	from := "from the gateway"
	if r.ReattestGraceFrom != GraceFromGateway {
		from = "the default, assumed: the gateway has not said its grace"
	}
	return fmt.Sprintf("%s (until %s; grace %s, %s)", left(r.ReattestDeadline.Sub(r.GatewayNow), "passed"),
		stamp(r.ReattestDeadline), Human(r.Grace()), from)
}

// left is "<d> left" for a positive d, else "<past> <-d> ago".
func left(d time.Duration, past string) string {
	if d > 0 {
		return Human(d) + " left"
	}
	return past + " " + Human(-d) + " ago"
}

// Human formats d for people, to two units: "6d23h", "23h59m", "4m5s",
// "12s".
func Human(d time.Duration) string {
	d = d.Round(time.Second)
	days := d / (24 * time.Hour)
	h := (d % (24 * time.Hour)) / time.Hour
	m := (d % time.Hour) / time.Minute
	s := (d % time.Minute) / time.Second
	switch {
	case days > 0:
		return fmt.Sprintf("%dd%dh", days, h)
	case h > 0:
		return fmt.Sprintf("%dh%dm", h, m)
	case m > 0:
		return fmt.Sprintf("%dm%ds", m, s)
	}
	return fmt.Sprintf("%ds", s)
}

// notRunning says why the bcd node of pid on dir is not running, or ""
// when it is: its process must exist and the data directory's lock must be
// held. A lock file this user cannot open leaves the process's word. The
// lock is probed only when the process exists (a reused pid), so
// a bcd node starting at that moment almost never finds it taken.
func notRunning(dir string, pid int) string {
	if pid <= 0 {
		return "the state file names no process"
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return fmt.Sprintf("process %d that wrote it is gone", pid)
	}
	held, err := lockHeld(filepath.Join(dir, identity.LockFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("no bcd node holds the data directory lock (no %s)", identity.LockFile)
	case err != nil:
		return "" // the process lives; the lock cannot tell more (not readable by this user)
	case !held:
		return fmt.Sprintf("no bcd node holds the data directory lock (%s)", identity.LockFile)
	}
	return ""
}

// lockHeld reports whether another open file holds a flock on path. A
// probe that gets the lock releases it at once.
func lockHeld(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	switch {
	case errors.Is(err, syscall.EWOULDBLOCK):
		return true, nil
	case err != nil:
		return false, err
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false, nil
}
