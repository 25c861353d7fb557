package doctor

import (
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/bcd/nodestate"
)

// Session reports the running bcd node's own word on its session, from the
// state file it keeps in dir (package bcd/nodestate): connected, or
// disconnected since when and why, and the time left on its certificate.
// Connected is ok. Disconnected, not running and no state warn: the agent
// retries by itself, and a node may be checked before its agent starts.
// A certificate expired past its re-attestation deadline fails: only a new
// join helps.
func Session(dir string, now time.Time) Result {
	r, err := nodestate.Inspect(dir, now)
	switch {
	case errors.Is(err, nodestate.ErrNoState):
		return result(IDSession, nodestate.File, Warn, "bcd node has left no state here: it is not running, or has never run (systemctl status bcd)")
	case err != nil:
		return result(IDSession, nodestate.File, Warn, "the state bcd node keeps does not read", err.Error())
	}
	detail := []string{
		"session " + orNone(r.SessionID) + ", gateway " + orNone(r.Gateway),
		"certificate expires " + r.CertificateSummary() + ", renew after " + r.CertRenewAfter.UTC().Format(time.RFC3339),
		"re-attestation " + r.ReattestSummary(),
		"state written " + r.UpdatedAt.UTC().Format(time.RFC3339) + " by pid " + fmt.Sprint(r.PID),
	}
	if r.ClockSkewSeconds != 0 {
		detail = append(detail, "this machine's clock is "+r.ClockSummary())
	}
	if r.LastError != "" {
		detail = append(detail, "last error "+r.LastError)
	}
	switch {
	case r.CertLeftSeconds <= 0 && r.ReattestLeftSeconds <= 0:
		return result(IDSession, nodestate.File, Fail, fmt.Sprintf("the certificate expired %s ago, past its re-attestation grace: join again with bcd join --force",
			nodestate.Human(r.GatewayNow.Sub(r.CertNotAfter))), detail...)
	case !r.Running:
		return result(IDSession, nodestate.File, Warn, "bcd node is not running ("+r.NotRunning+"); when it stopped it was "+r.Line(), detail...)
	case r.Connected:
		return result(IDSession, nodestate.File, OK, r.Line(), detail...)
	case r.CertLeftSeconds <= 0:
		return result(IDSession, nodestate.File, Warn, fmt.Sprintf("%s; the certificate has expired: re-attestation has %s left to bring it back",
			r.Line(), nodestate.Human(time.Duration(r.ReattestLeftSeconds)*time.Second)), detail...)
	}
	return result(IDSession, nodestate.File, Warn, fmt.Sprintf("%s (%s left): bcd node retries by itself; the gateway checks say why it cannot connect",
		r.Line(), nodestate.Human(time.Duration(r.CertLeftSeconds)*time.Second)), detail...)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
