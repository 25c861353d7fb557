package ipmi

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/cookiejar"
	"strconv"
	"time"

	"github.com/stmcginnis/gofish"

	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// redfishHTTPClient is the HTTP client of Redfish calls to t: TLS 1.2 or
// later, the certificate verified against t's CAs when it has some, no
// proxy, no connection reuse across calls.
func redfishHTTPClient(t *target) *http.Client {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.rfCAs != nil {
		tlsConf.RootCAs = t.rfCAs
	} else {
		// BMCs mostly serve self-signed certificates; redfish_ca_pem is
		// how an operator who knows the BMC's CA turns checking on.
		tlsConf.InsecureSkipVerify = true //nolint:gosec // documented default, see plugin.proto
	}
	jar, _ := cookiejar.New(nil) // some BMCs keep their session in a cookie
	return &http.Client{
		Jar: jar,
		Transport: &http.Transport{
			TLSClientConfig:       tlsConf,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: time.Minute,
			DisableKeepAlives:     true,
		},
	}
}

// redfishInfo reads the BMC's vendor, model and serial (the first
// ComputerSystem) and firmware (the first Manager of type BMC, else the
// first Manager) through gofish.
func redfishInfo(ctx context.Context, t *target) (*pluginv1.BMCInfoResponse, error) {
	hc := redfishHTTPClient(t)
	if d, ok := ctx.Deadline(); ok {
		hc.Timeout = time.Until(d)
	}
	c, err := gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint:   "https://" + net.JoinHostPort(t.address, strconv.Itoa(t.rfPort)),
		Username:   t.username,
		Password:   t.password,
		HTTPClient: hc,
	})
	if err != nil {
		return nil, err
	}
	defer c.Logout()
	out := &pluginv1.BMCInfoResponse{Provider: pluginv1.Provider_PROVIDER_REDFISH}
	systems, err := c.Service.Systems()
	if err != nil {
		return nil, fmt.Errorf("read systems: %w", err)
	}
	if len(systems) > 0 {
		out.Vendor, out.Model, out.Serial = systems[0].Manufacturer, systems[0].Model, systems[0].SerialNumber
	}
	managers, err := c.Service.Managers()
	if err != nil {
		return nil, fmt.Errorf("read managers: %w", err)
	}
	for i, m := range managers {
		if i == 0 || m.ManagerType == "BMC" {
			out.FirmwareVersion = m.FirmwareVersion
		}
		if m.ManagerType == "BMC" {
			break
		}
	}
	return out, nil
}
