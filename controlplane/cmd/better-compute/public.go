package main

import (
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
)

// publicFlags are the flags of serve and dev that make the control plane
// reachable from other machines (docs/configuration.md, "Reaching the
// control plane from other machines").
type publicFlags struct {
	publicURL, gatewayListen      string
	apiTLS, apiTLSCert, apiTLSKey string
}

func (p *publicFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&p.publicURL, "public-url", "", "the gateway's URL as other machines reach it, https://HOST:8443 (host.gateway.publicURL, env "+config.EnvPublicURL+"); the API is then on the same host at host.listen's port, and served over HTTPS")
	fl.StringVar(&p.gatewayListen, "gateway-listen", "", "gateway listen address HOST:PORT (host.gateway.listen, env "+config.EnvGatewayListen+"; default 0.0.0.0:8443)")
	fl.StringVar(&p.apiTLS, "api-tls", "", "API HTTPS: off, auto (a certificate from the gateway serving CA) or files (host.tls.mode, env "+config.EnvAPITLS+"; default auto with a public URL off loopback, else off)")
	fl.StringVar(&p.apiTLSCert, "api-tls-cert", "", "API certificate PEM file for --api-tls files (env "+config.EnvAPITLSCert+")")
	fl.StringVar(&p.apiTLSKey, "api-tls-key", "", "API key PEM file for --api-tls files (env "+config.EnvAPITLSKey+")")
}

// apply sets the flags given in f.
func (p *publicFlags) apply(f *config.Flags) {
	f.PublicURL, f.GatewayListen = p.publicURL, p.gatewayListen
	f.APITLS, f.APITLSCert, f.APITLSKey = p.apiTLS, p.apiTLSCert, p.apiTLSKey
}
