package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
)

// pkiIssueInternalCmd issues a control-plane process's certificate for the
// internal control API (docs/tunnels.md).
func pkiIssueInternalCmd(e *env) *cobra.Command {
	var (
		name, out string
		cf        certFlags
	)
	cmd := &cobra.Command{
		Use:   "issue-internal --name NAME [--dns NAME] [--ip IP] --out-dir DIR",
		Short: "Issue a control-plane process's internal control API certificate into DIR/internal.crt and DIR/internal.key (mode 0600)",
		Long: `issue-internal issues, from the internal CA, the certificate both sides of
the internal control API present (host.gateway.internal.tlsFiles): a gateway
serves with it on host.gateway.internal.listen, the api presents it as a
client. --dns and --ip are the names a gateway is dialled by (the host of
host.gateway.internal.address); an api-only process needs none.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if name == "" {
				return usageError{errors.New("--name is required (such as gw-1 or api-1)")}
			}
			addrs, err := cf.check()
			if err != nil {
				return err
			}
			return e.issueCert(cmd.Context(), out, issuedCert{
				action:  "pki.issue-internal",
				details: map[string]any{"name": name, "dns": cf.dns, "ips": cf.ips},
				write: func(b *pki.Bundle) (string, string, error) {
					return bootstrap.WriteInternalCert(b, cf.outDir, name, cf.dns, addrs, cf.ttl)
				},
				result: func(_ *pki.Bundle, cert, key string, notAfter time.Time) any {
					return struct {
						Name     string    `json:"name"`
						Cert     string    `json:"cert"`
						Key      string    `json:"key"`
						DNS      []string  `json:"dns"`
						IPs      []string  `json:"ips"`
						NotAfter time.Time `json:"notAfter"`
					}{name, cert, key, cf.dns, cf.ips, notAfter}
				},
				filesKey: "host.gateway.internal.tlsFiles",
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the process's name, in its SPIFFE ID spiffe://<trust domain>/internal/<name> (required)")
	cf.add(cmd, "the gateway's internal API is dialled by", "internal.crt and internal.key")
	outputFlag(cmd, &out)
	return cmd
}
