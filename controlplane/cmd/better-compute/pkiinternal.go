package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/bootstrap"
	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// pkiIssueInternalCmd issues a control-plane process's certificate for the
// internal control API (docs/tunnels.md).
func pkiIssueInternalCmd(e *env) *cobra.Command {
	var (
		name, outDir, out string
		dns, ips          []string
		ttl               time.Duration
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
			if outDir == "" {
				return usageError{errors.New("--out-dir is required")}
			}
			if ttl < 0 {
				return usageError{fmt.Errorf("--ttl %s is negative", ttl)}
			}
			var addrs []net.IP
			for _, s := range ips {
				ip := net.ParseIP(s)
				if ip == nil {
					return usageError{fmt.Errorf("--ip %q is not an IP address", s)}
				}
				addrs = append(addrs, ip)
			}
			return e.withStore(cmd.Context(), false, func(cfg *config.Config, st store.Store) error {
				ctx := cmd.Context()
				b, err := bundle(ctx, cfg, st)
				if err != nil {
					return err
				}
				certPath, keyPath, err := bootstrap.WriteInternalCert(b, outDir, name, dns, addrs, ttl)
				if errors.Is(err, pki.ErrName) || errors.Is(err, pki.ErrTTL) {
					return usageError{err}
				}
				if err != nil {
					return err
				}
				notAfter, err := leafNotAfter(certPath)
				if err != nil {
					return err
				}
				details, _ := json.Marshal(map[string]any{"name": name, "dns": dns, "ips": ips, "notAfter": notAfter})
				if err := audit(ctx, st, "pki.issue-internal", "pki", details); err != nil {
					return err
				}
				res := struct {
					Name     string    `json:"name"`
					Cert     string    `json:"cert"`
					Key      string    `json:"key"`
					DNS      []string  `json:"dns"`
					IPs      []string  `json:"ips"`
					NotAfter time.Time `json:"notAfter"`
				}{name, certPath, keyPath, dns, ips, notAfter}
				if out == "json" {
					return printValue(e.stdout, res)
				}
				fmt.Fprintf(e.stdout, "wrote %s and %s (valid until %s)\nset host.gateway.internal.tlsFiles.cert and .key to them\n",
					certPath, keyPath, notAfter.Format(time.RFC3339))
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&name, "name", "", "the process's name, in its SPIFFE ID spiffe://<trust domain>/internal/<name> (required)")
	fl.StringSliceVar(&dns, "dns", nil, "DNS name the gateway's internal API is dialled by (repeat or comma-separate)")
	fl.StringSliceVar(&ips, "ip", nil, "IP address the gateway's internal API is dialled by (repeat or comma-separate)")
	fl.StringVar(&outDir, "out-dir", "", "directory to write internal.crt and internal.key into (required)")
	fl.DurationVar(&ttl, "ttl", 0, "certificate lifetime (default one year)")
	outputFlag(cmd, &out)
	return cmd
}
