package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// pkiCmd groups the PKI commands (docs/pki.md).
func pkiCmd(e *env) *cobra.Command {
	c := &cobra.Command{Use: "pki", Short: "Initialise the machine PKI, issue gateway certificates, revoke node certificates"}
	c.AddCommand(pkiInitCmd(e), pkiIssueGatewayCmd(e), pkiIssueInternalCmd(e), pkiRevokeCmd(e), pkiRotateCmd(e))
	return c
}

func pkiInitCmd(e *env) *cobra.Command {
	var trustDomain, out string
	cmd := &cobra.Command{
		Use:   "init --trust-domain D",
		Short: "Make the node, gateway and internal CAs and store them sealed under the deployment secret (once per deployment)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if err := pki.ValidateTrustDomain(trustDomain); err != nil {
				return usageError{fmt.Errorf("--trust-domain: %w", err)}
			}
			return e.withStore(cmd.Context(), true, func(cfg *config.Config, st store.Store) error {
				ctx := cmd.Context()
				// The bundle, its audit entry and the deployment's first
				// admin token (printed this once, when the database has no
				// API token yet) in one transaction.
				made, err := bootstrap.InitDeployment(ctx, st, cfg.Secret, trustDomain, cfg.PKI.NodeCAValidity.Duration, func(ctx context.Context, tx bootstrap.InitTx) error {
					details, _ := json.Marshal(map[string]string{"trustDomain": trustDomain})
					return audit(ctx, tx, "pki.init", "pki", details)
				})
				if err != nil {
					return err
				}
				b, adminToken := made.Bundle, made.AdminToken
				res := struct {
					TrustDomain    string    `json:"trustDomain"`
					GatewayPin     string    `json:"gatewayPin"`
					NodeCANotAfter time.Time `json:"nodeCaNotAfter"`
					AdminToken     string    `json:"adminToken,omitempty"`
				}{b.TrustDomain, b.GatewayPin(), b.NodeCA.Cert.NotAfter.UTC(), adminToken}
				if out == "json" {
					return printValue(e.stdout, res)
				}
				if made.Completed {
					fmt.Fprintln(e.stdout, "found the PKI bundle of an earlier pki init without its admin token: completed it")
				}
				fmt.Fprintf(e.stdout, "PKI initialised for trust domain %s\ngateway CA pin: %s\n", res.TrustDomain, res.GatewayPin)
				if adminToken != "" {
					fmt.Fprintf(e.stdout, "first admin API token (shown once, keep it safe): %s\n", adminToken)
				}
				fmt.Fprintln(e.stdout, "next: better-compute pki issue-gateway --dns <gateway host> --out-dir <dir>")
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&trustDomain, "trust-domain", "", "SPIFFE trust domain of every identity, such as compute.example.com (required)")
	_ = cmd.MarkFlagRequired("trust-domain")
	outputFlag(cmd, &out)
	return cmd
}

func pkiIssueGatewayCmd(e *env) *cobra.Command {
	var (
		cf  certFlags
		out string
	)
	cmd := &cobra.Command{
		Use:   "issue-gateway --dns NAME [--ip IP] --out-dir DIR",
		Short: "Issue a gateway's TLS serving certificate into DIR/gateway.crt and DIR/gateway.key (mode 0600)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if len(cf.dns) == 0 && len(cf.ips) == 0 {
				return usageError{errors.New("give at least one --dns name or --ip address the gateway is reached by")}
			}
			addrs, err := cf.check()
			if err != nil {
				return err
			}
			return e.issueCert(cmd.Context(), out, issuedCert{
				action:  "pki.issue-gateway",
				details: map[string]any{"dns": cf.dns, "ips": cf.ips},
				write: func(b *pki.Bundle) (string, string, error) {
					return bootstrap.WriteGatewayCert(b, cf.outDir, cf.dns, addrs, cf.ttl)
				},
				result: func(b *pki.Bundle, cert, key string, notAfter time.Time) any {
					return struct {
						Cert       string    `json:"cert"`
						Key        string    `json:"key"`
						DNS        []string  `json:"dns"`
						IPs        []string  `json:"ips"`
						NotAfter   time.Time `json:"notAfter"`
						GatewayPin string    `json:"gatewayPin"`
					}{cert, key, cf.dns, cf.ips, notAfter, b.GatewayPin()}
				},
				filesKey: "host.gateway.tlsFiles",
			})
		},
	}
	cf.add(cmd, "daemons dial", "gateway.crt and gateway.key")
	outputFlag(cmd, &out)
	return cmd
}

// certFlags are the flags pki issue-gateway and pki issue-internal share:
// the names the certificate is dialled by, where it is written and for how
// long it is valid.
type certFlags struct {
	dns, ips []string
	outDir   string
	ttl      time.Duration
}

// add adds the flags to cmd: dialledBy says who dials the names ("daemons
// dial"), files what --out-dir receives.
func (f *certFlags) add(cmd *cobra.Command, dialledBy, files string) {
	fl := cmd.Flags()
	fl.StringSliceVar(&f.dns, "dns", nil, "DNS name "+dialledBy+" (repeat or comma-separate)")
	fl.StringSliceVar(&f.ips, "ip", nil, "IP address "+dialledBy+" (repeat or comma-separate)")
	fl.StringVar(&f.outDir, "out-dir", "", "directory to write "+files+" into (required)")
	fl.DurationVar(&f.ttl, "ttl", 0, "certificate lifetime (default one year)")
}

// check checks --out-dir and --ttl and parses --ip; its errors are usage
// errors.
func (f *certFlags) check() ([]net.IP, error) {
	if f.outDir == "" {
		return nil, usageError{errors.New("--out-dir is required")}
	}
	if f.ttl < 0 {
		return nil, usageError{fmt.Errorf("--ttl %s is negative", f.ttl)}
	}
	var addrs []net.IP
	for _, s := range f.ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, usageError{fmt.Errorf("--ip %q is not an IP address", s)}
		}
		addrs = append(addrs, ip)
	}
	return addrs, nil
}

// issuedCert is what one pki issue-* command writes and says.
type issuedCert struct {
	// action is the audit row's action; details its details, to which
	// the certificate's notAfter is added.
	action  string
	details map[string]any
	// write writes the certificate and key with the deployment's bundle
	// and returns their paths; a pki.ErrName or pki.ErrTTL is a usage
	// error.
	write func(*pki.Bundle) (cert, key string, err error)
	// result is what -o json prints.
	result func(b *pki.Bundle, cert, key string, notAfter time.Time) any
	// filesKey is the configuration key whose .cert and .key take the
	// files.
	filesKey string
}

// issueCert opens the deployment's PKI bundle (the CA keys are in the
// database: withStore), writes c's certificate, audits it and prints it.
func (e *env) issueCert(ctx context.Context, out string, c issuedCert) error {
	return e.withStore(ctx, false, func(cfg *config.Config, st store.Store) error {
		b, err := bundle(ctx, cfg, st)
		if err != nil {
			return err
		}
		certPath, keyPath, err := c.write(b)
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
		c.details["notAfter"] = notAfter
		details, _ := json.Marshal(c.details)
		if err := audit(ctx, st, c.action, "pki", details); err != nil {
			return err
		}
		if out == "json" {
			return printValue(e.stdout, c.result(b, certPath, keyPath, notAfter))
		}
		fmt.Fprintf(e.stdout, "wrote %s and %s (valid until %s)\nset %s.cert and .key to them\n",
			certPath, keyPath, notAfter.Format(time.RFC3339), c.filesKey)
		return nil
	})
}

// leafNotAfter reads the end of validity of the first certificate in path.
func leafNotAfter(path string) (time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return time.Time{}, fmt.Errorf("%s holds no certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return time.Time{}, err
	}
	return c.NotAfter.UTC(), nil
}

func pkiRevokeCmd(e *env) *cobra.Command {
	var af apiFlags
	var nodeID, serial, reason, out string
	cmd := &cobra.Command{
		Use:   "revoke --node ID | --serial S",
		Short: "Revoke a node's current certificate or a certificate serial; gateways close the sessions within seconds",
		Long: `revoke calls pki.revoke: with --node the node's current certificate (and
gateways end every session it opened before), with --serial that serial
(hex, colons and 0x allowed, as the audit log and nodes show it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if (nodeID == "") == (serial == "") {
				return usageError{errors.New("give exactly one of --node and --serial")}
			}
			if serial != "" {
				s, err := apiv1.CanonicalSerial(serial)
				if err != nil {
					return usageError{fmt.Errorf("--serial %q: %w", serial, err)}
				}
				serial = s
			}
			req := &apiv1.RevokeCertificateRequest{NodeId: nodeID, Serial: serial, Reason: reason}
			return runAPI(cmd.Context(), e, &af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.RevokeCertificateResponse, error) {
					return c.PkiRevoke(ctx, req)
				},
				func(_ *client.Client, res *apiv1.RevokeCertificateResponse) error {
					revoked := strings.Join(res.Serials, ", ")
					switch {
					case res.AlreadyRevoked:
						fmt.Fprintf(e.stdout, "certificate %s was already revoked\n", revoked)
					case res.NodeId != "":
						fmt.Fprintf(e.stdout, "revoked certificate %s of node %s\n", revoked, res.NodeId)
					default:
						fmt.Fprintf(e.stdout, "revoked certificate %s\n", revoked)
					}
					return nil
				})
		},
	}
	af.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&nodeID, "node", "", "node id: revoke its current certificate and end its sessions")
	fl.StringVar(&serial, "serial", "", "certificate serial (hex, as the audit log and nodes show it)")
	fl.StringVar(&reason, "reason", "revoked by an operator", "why, for the record")
	outputFlag(cmd, &out)
	return cmd
}
