package session

import (
	"crypto/tls"
	"net"
	"testing"
)

// TestRefusedIssuerOnlyUnknownCA: only unknown_ca reads as the gateway
// refusing the certificate's issuer (re-attest); bad_certificate, which a
// gateway sends for many other reasons, is not recorded.
func TestRefusedIssuerOnlyUnknownCA(t *testing.T) {
	for alert, want := range map[tls.AlertError]bool{48: true, 42: false, 45: false} {
		var vf verifyFailure
		if a := refusalAlert(&net.OpError{Op: "remote error", Err: alert}); a != 0 {
			vf.setAlert(a)
		}
		if got := vf.refusedIssuer(); got != want {
			t.Errorf("alert %d (%v): refusedIssuer %v, want %v", alert, alert, got, want)
		}
	}
}
