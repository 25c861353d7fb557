package main

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// tokenEnv is the environment variable a join token may be passed in.
const tokenEnv = "BCD_JOIN_TOKEN"

// maxTokenFile bounds what is read from a token file or stdin.
const maxTokenFile = 4 << 10

type joinFlags struct {
	gateway   string
	tokenFile string
	dataDir   string
	caFile    string
	caPin     string
	labels    map[string]string
	force     bool
	timeout   time.Duration
	logLevel  string
}

func newJoinCmd(e env) *cobra.Command {
	var f joinFlags
	cmd := &cobra.Command{
		Use:   "join --gateway URL --token-file FILE",
		Short: "Join this machine to Better Compute with a join token",
		Long: `Join makes the node's key (ECDSA P-256), sends a certificate request and the
join token to the gateway, and writes the node's identity under the data
directory.

The token is read from --token-file (a file, or - for standard input) or else
from the BCD_JOIN_TOKEN environment variable; it is never printed. The gateway
is trusted through the pin the token carries, or through --ca-file or --ca-pin
when given, never on first use.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return join(cmd, e, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.gateway, "gateway", "", "gateway URL, https://host[:port] (required)")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the join token, - for standard input (default: $"+tokenEnv+")")
	fl.StringVar(&f.dataDir, "data-dir", identity.DefaultDir, "directory for the node's identity")
	fl.StringVar(&f.caFile, "ca-file", "", "PEM file of the gateway serving CA to trust instead of the token's pin")
	fl.StringVar(&f.caPin, "ca-pin", "", "pin of the gateway serving CA (sha256/...) to trust instead of the token's pin")
	fl.StringToStringVar(&f.labels, "label", nil, "label for the node, key=value (repeatable)")
	fl.BoolVar(&f.force, "force", false, "replace an identity the data directory already holds")
	fl.DurationVar(&f.timeout, "timeout", session.DefaultJoinTimeout, "time limit for the join")
	fl.StringVar(&f.logLevel, "log-level", "warn", "log level: debug, info, warn or error")
	return cmd
}

func join(cmd *cobra.Command, e env, f *joinFlags) error {
	ctx := cmd.Context()
	log, err := newLogger(e.stderr, f.logLevel)
	if err != nil {
		return err
	}
	if f.gateway == "" {
		return usagef("--gateway is required")
	}
	if err := session.CheckGatewayURL(f.gateway); err != nil {
		return usagef("--gateway: %w", err)
	}
	if f.dataDir == "" {
		return usagef("--data-dir must not be empty")
	}
	if f.caFile != "" && f.caPin != "" {
		return usagef("--ca-file and --ca-pin exclude each other")
	}
	if f.timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	var trust session.Trust
	var caCerts []*x509.Certificate
	switch {
	case f.caPin != "":
		if _, err := jointoken.ParsePin(f.caPin); err != nil {
			return usagef("--ca-pin: %w", err)
		}
		trust.Pin = f.caPin
	case f.caFile != "":
		certs, err := identity.ReadCertificates(f.caFile)
		if err != nil {
			return usagef("--ca-file: %w", err)
		}
		caCerts = certs
		trust.Roots = x509.NewCertPool()
		for _, c := range certs {
			trust.Roots.AddCert(c)
		}
	}
	token, err := readToken(e, f.tokenFile)
	if err != nil {
		return err
	}

	store := identity.NewStore(f.dataDir)
	old, err := store.Load()
	switch {
	case err == nil && !f.force:
		return fmt.Errorf("this machine already joined as node %s (%s); pass --force to join again", old.NodeID, store.Dir())
	case err != nil && !errors.Is(err, identity.ErrNotJoined) && !f.force:
		return fmt.Errorf("%w; pass --force to replace it", err)
	case err != nil:
		old = nil
	}
	if err := store.Prepare(); err != nil {
		return err
	}
	// The key is made and stored before Join, and kept when the join
	// fails: a retry (after a lost reply) is the same joiner. A machine
	// that still holds a node's identity proves that node's key and
	// stays that node (DESIGN.md, "Identity over time").
	var key crypto.Signer
	var prove []*x509.Certificate
	if old != nil {
		key, prove = old.Key, old.Chain
	} else if key, _, err = store.JoinKey(); err != nil {
		return err
	}
	params := session.JoinParams{
		GatewayURL: f.gateway,
		Token:      token,
		Key:        key,
		Facts:      facts(f.labels),
		Trust:      trust,
		Timeout:    f.timeout,
		UserAgent:  "bcd/" + bcdVersion(),
		Logger:     log,
		ProveChain: prove,
	}
	res, err := session.Join(ctx, params)
	if prove != nil && errors.Is(err, session.ErrProofRefused) {
		// Another deployment's identity, a deleted or revoked node, or a
		// key the node no longer has: --force asked for that node, so say
		// why not and how to go on, rather than make another node.
		return fmt.Errorf("%w; this machine cannot take back node %s: to bring it back use a token from `better-compute nodes reinstall %s` (a revoked node comes back as a new node); to join it as a new node, move %s away first",
			err, old.NodeID, old.NodeID, store.Dir())
	}
	if errors.Is(err, session.ErrConfig) {
		return usageError{err} // from the flags: --gateway, --ca-file, --ca-pin
	}
	if err != nil {
		return err
	}
	id := identity.FromJoin(res, key, caCerts, wallNow())
	if err := store.Save(id); err != nil {
		return err
	}
	log.InfoContext(ctx, "Joined", logkey.NodeID, id.NodeID, "spiffe_id", id.SPIFFEID, "data_dir", store.Dir(),
		"rejoined", res.Rejoined, "repeated", res.Repeated)
	for _, w := range res.Warnings {
		fmt.Fprintf(e.stderr, "warning: %s\n", w)
	}
	if _, err := fmt.Fprintf(e.stdout, "Joined as node %s (%s); identity in %s; gateways: %s\n",
		id.NodeID, id.SPIFFEID, store.Dir(), strings.Join(id.Gateways, ", ")); err != nil {
		return err
	}
	// The token decides where the node joins; the install script prints
	// this line so the operator sees it.
	if _, err := fmt.Fprintf(e.stdout, "Placed in pool %s, site %s, region %s\n",
		named(res.PoolName, id.PoolID), named(res.SiteName, id.SiteID), id.Region); err != nil {
		return err
	}
	switch {
	case res.Repeated:
		_, err = fmt.Fprintln(e.stdout, "The gateway recognised this join as a retry of an earlier one with this key: the same node, no further token use.")
	case res.Rejoined:
		_, err = fmt.Fprintf(e.stdout, "Node %s kept its id, labels and history.\n", id.NodeID)
	}
	return err
}

// readToken reads the join token from path ("-": stdin) or else from
// $BCD_JOIN_TOKEN. Errors never contain the token.
func readToken(e env, path string) (string, error) {
	var raw []byte
	switch path {
	case "":
		t := e.getenv(tokenEnv)
		if t == "" {
			return "", usagef("no join token: pass --token-file FILE, --token-file - (standard input) or set %s", tokenEnv)
		}
		raw = []byte(t)
	case "-":
		b, err := io.ReadAll(io.LimitReader(e.stdin, maxTokenFile))
		if err != nil {
			return "", fmt.Errorf("read join token from standard input: %w", err)
		}
		raw = b
	default:
		fh, err := os.Open(path)
		if err != nil {
			return "", usagef("--token-file: %w", err)
		}
		defer fh.Close()
		b, err := io.ReadAll(io.LimitReader(fh, maxTokenFile))
		if err != nil {
			return "", fmt.Errorf("read join token from %s: %w", path, err)
		}
		raw = b
	}
	// A byte order mark, as some editors write, is not part of the token.
	tok := strings.TrimSpace(strings.TrimPrefix(string(raw), "\ufeff"))
	if tok == "" {
		return "", usagef("the join token is empty")
	}
	if _, err := jointoken.Parse(tok); err != nil {
		return "", usagef("join token: %w", err)
	}
	return tok, nil
}

// named prints an object by its name and id ("default (pool_abc)"), or by
// its id alone when the gateway sent no name (an older control plane).
func named(name, id string) string {
	if name == "" || name == id {
		return id
	}
	return name + " (" + id + ")"
}
