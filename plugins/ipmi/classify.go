package ipmi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/stmcginnis/gofish/common"

	"github.com/better-compute/better-compute/bcd/plugin"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// errUnsupported marks a provider that cannot do an operation at all.
var errUnsupported = errors.New("not supported")

// failure is one provider's failed attempt.
type failure struct {
	provider pluginv1.Provider
	reason   plugin.Reason
	detail   string
}

// ipmiSessionRefused is what ipmitool prints when the BMC answers but
// refuses the RMCP+ session: a wrong user name or password (RAKP), or a
// cipher suite it does not offer. A BMC that does not answer makes ipmitool
// retry until it is killed at the deadline.
const ipmiSessionRefused = "Unable to establish IPMI v2 / RMCP+ session"

// classify turns a provider's error into a failure. budget is the share of
// time the attempt had, for the timeout message.
func classify(p pluginv1.Provider, err error, budget time.Duration) failure {
	f := failure{provider: p, reason: plugin.ReasonBMCError}
	text := oneLine(err)
	var gf *common.Error
	var netErr net.Error
	var opErr *net.OpError
	var dnsErr *net.DNSError
	var verifyErr *tls.CertificateVerificationError
	var authorityErr x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalidErr x509.CertificateInvalidError
	switch {
	case errors.Is(err, errUnsupported):
		f.reason, f.detail = plugin.ReasonUnsupported, text
	case errors.Is(err, exec.ErrNotFound):
		f.reason, f.detail = plugin.ReasonUnsupported, "ipmitool is not installed"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout(),
		strings.Contains(text, "Client.Timeout exceeded"):
		f.reason, f.detail = plugin.ReasonTimeout, fmt.Sprintf("no answer within %s", budget.Round(10*time.Millisecond))
	case p == pluginv1.Provider_PROVIDER_IPMITOOL && strings.Contains(text, ipmiSessionRefused):
		f.reason, f.detail = plugin.ReasonAuthFailed, "the BMC refused the IPMI session: wrong user name or password, or a cipher suite it does not offer"
	case errors.As(err, &gf) && (gf.HTTPReturnedStatusCode == 401 || gf.HTTPReturnedStatusCode == 403):
		f.reason, f.detail = plugin.ReasonAuthFailed, fmt.Sprintf("the BMC refused the login (HTTP %d): wrong user name or password", gf.HTTPReturnedStatusCode)
	case errors.As(err, &verifyErr), errors.As(err, &authorityErr), errors.As(err, &hostErr), errors.As(err, &invalidErr):
		f.detail = "the Redfish TLS certificate does not verify against redfish_ca_pem: " + text
	case errors.As(err, &dnsErr):
		f.reason, f.detail = plugin.ReasonUnreachable, "cannot resolve the address: "+text
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.As(err, &opErr):
		f.reason, f.detail = plugin.ReasonUnreachable, "unreachable: "+text
	default:
		f.detail = text
	}
	return f
}

// oneLine is err's text on one line: bmclib's multierror lists and ipmitool's
// output span several.
func oneLine(err error) string {
	var me *multierror.Error
	var parts []string
	if errors.As(err, &me) {
		for _, e := range me.Errors {
			parts = append(parts, e.Error())
		}
	} else {
		parts = []string{err.Error()}
	}
	s := strings.Join(parts, "; ")
	s = strings.Join(strings.Fields(s), " ")
	const limit = 500
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return s
}

// combine is the error for a call every provider failed: the gRPC status
// plugin.proto asks for, naming the BMC and each provider's failure, with
// the target's password scrubbed.
func combine(t *target, op string, fails []failure) error {
	reason := overallReason(fails)
	var b strings.Builder
	fmt.Fprintf(&b, "bmc %s: %s: ", t.address, op)
	for i, f := range fails {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", t.where(f.provider), f.detail)
	}
	return plugin.StatusError(reason, plugin.Scrub(b.String(), t.password))
}

// overallReason picks the call's reason from its providers' failures: a
// refused login says the most, then a BMC that answered with an error, then
// silence; UNSUPPORTED only when no provider could try.
func overallReason(fails []failure) plugin.Reason {
	has := map[plugin.Reason]bool{}
	for _, f := range fails {
		has[f.reason] = true
	}
	for _, r := range []plugin.Reason{plugin.ReasonAuthFailed, plugin.ReasonBMCError, plugin.ReasonTimeout, plugin.ReasonUnreachable} {
		if has[r] {
			return r
		}
	}
	return plugin.ReasonUnsupported
}

// invalid is the error for a malformed request.
func invalid(err error) error {
	return plugin.StatusError(plugin.ReasonInvalidRequest, err.Error())
}
