package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/store/transfer"
)

// storeCmd groups the commands that move a whole database (docs/scaling.md).
func storeCmd(e *env) *cobra.Command {
	c := &cobra.Command{Use: "store", Short: "Move a whole deployment's database (store copy)"}
	c.AddCommand(storeCopyCmd(e))
	return c
}

func storeCopyCmd(e *env) *cobra.Command {
	var (
		to      string
		replace bool
		out     string
	)
	cmd := &cobra.Command{
		Use:   "copy --to postgres://...",
		Short: "Copy a stopped embedded deployment into an empty PostgreSQL database, identities and history intact",
		Long: `Copy the embedded SQLite database of a stopped deployment (--data-dir) into an
empty PostgreSQL database: the target is migrated, every table is copied in one
transaction and verified (row count and checksum per table) before it commits.
Nodes keep their identities: start the PostgreSQL deployment with the same
secret and gateway address and they reconnect without joining again.
Run it again after an interruption, or with --replace to overwrite a target that
holds rows. See docs/scaling.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if to == "" {
				return usageError{errors.New("--to postgres://... is required")}
			}
			return e.storeCopy(cmd.Context(), to, replace, out)
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "PostgreSQL URL of the target database (required)")
	cmd.Flags().BoolVar(&replace, "replace", false, "empty the target's tables first (a rerun after an interrupted or earlier copy)")
	outputFlag(cmd, &out)
	return cmd
}

// embeddedSource is a stopped embedded deployment opened for a whole
// database operation: its configuration, its secret and where it came
// from, and the exclusive lock on its data directory.
type embeddedSource struct {
	cfg        *config.Config
	secretFile string // the data dir's secret file; "" when the secret came from the configuration or environment
	lock       *backend.DataDirLock
}

// stoppedDeployment loads the configuration of an embedded deployment
// that no process runs, takes its data directory's lock (exclusive) and
// checks that the deployment secret opens its PKI bundle. what names the
// command in errors.
func (e *env) stoppedDeployment(ctx context.Context, what string) (*embeddedSource, error) {
	cfg, err := e.load(config.Flags{})
	if err != nil {
		return nil, err
	}
	if !cfg.Embedded {
		return nil, usageError{fmt.Errorf("%s works on the embedded default: this configuration names a database URL (%s or database.url); unset it and give the deployment's --data-dir", what, config.EnvDatabaseURL)}
	}
	if err := checkDeployment(cfg); err != nil {
		return nil, err
	}
	src := &embeddedSource{cfg: cfg}
	if cfg.Secret == "" {
		src.secretFile = filepath.Join(cfg.DataDir, config.SecretFile)
		b, err := os.ReadFile(src.secretFile)
		if err != nil {
			return nil, fmt.Errorf("read the deployment secret: %w (or set %s)", err, config.EnvSecret)
		}
		cfg.Secret = strings.TrimSpace(string(b))
	}
	src.lock, err = backend.LockDataDir(cfg.DataDir, true, fmt.Sprintf("better-compute %s (pid %d)", what, os.Getpid()))
	if errors.Is(err, backend.ErrDataDirInUse) {
		return nil, fmt.Errorf("%s copies a stopped deployment, and this one runs: %w; stop it first", what, err)
	}
	if err != nil {
		return nil, err
	}
	if err := checkSecret(ctx, filepath.Join(cfg.DataDir, backend.EmbeddedFile), cfg.Secret); err != nil {
		src.lock.Release()
		return nil, err
	}
	return src, nil
}

// checkSecret opens the PKI bundle of the embedded database at path with
// secret: a wrong secret is refused before anything is written.
func checkSecret(ctx context.Context, path, secret string) error {
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		return err
	}
	defer st.Close()
	_, err = bootstrap.LoadBundle(ctx, st, secret)
	if errors.Is(err, pki.ErrSealOpen) {
		return fmt.Errorf("the deployment secret does not open the PKI bundle in %s (%w); nothing was written: give the secret the deployment runs with (%s, or its data dir's %s file)",
			path, err, config.EnvSecret, config.SecretFile)
	}
	if err != nil {
		return fmt.Errorf("open the PKI bundle in %s: %w", path, err)
	}
	return nil
}

func (e *env) storeCopy(ctx context.Context, to string, replace bool, out string) error {
	src, err := e.stoppedDeployment(ctx, "store copy")
	if err != nil {
		return err
	}
	defer src.lock.Release()
	cfg := src.cfg
	progress := progressPrinter(e)
	res, err := transfer.Copy(ctx, transfer.Config{
		Source:   filepath.Join(cfg.DataDir, backend.EmbeddedFile),
		Target:   to,
		Replace:  replace,
		Progress: progress,
	})
	var ne *transfer.NotEmptyError
	if errors.As(err, &ne) {
		return fmt.Errorf("%w; nothing was written: give an empty database, or --replace to overwrite it", err)
	}
	if err != nil {
		return err
	}
	gw := gatewayCertNames(filepath.Join(cfg.DataDir, bootstrap.PKIDir, bootstrap.GatewayCertFile))
	if out == "json" {
		type tbl struct {
			Name     string `json:"name"`
			Rows     int64  `json:"rows"`
			Checksum string `json:"checksum"`
		}
		v := struct {
			Tables       []tbl    `json:"tables"`
			Rows         int64    `json:"rows"`
			Seconds      float64  `json:"seconds"`
			Migrated     []string `json:"migrated"`
			IssueGateway string   `json:"issueGateway"`
		}{Rows: res.Rows, Seconds: res.Elapsed.Seconds(), Migrated: res.Migrated, IssueGateway: issueGatewayLine(to, src, gw)}
		for _, t := range res.Tables {
			v.Tables = append(v.Tables, tbl{t.Name, t.Rows, t.Checksum.String()})
		}
		return printValue(e.stdout, v)
	}
	rows := make([][]string, 0, len(res.Tables))
	for _, t := range res.Tables {
		rows = append(rows, []string{t.Name, fmt.Sprint(t.Rows), t.Checksum.String()[:16], "equal"})
	}
	if err := table(e.stdout, []string{"TABLE", "ROWS", "CHECKSUM", "SOURCE/TARGET"}, rows); err != nil {
		return err
	}
	rate := float64(res.Rows) / max(res.Elapsed.Seconds(), 1e-3)
	fmt.Fprintf(e.stdout, "copied %d rows in %d tables in %.1f s (%.0f rows/s), verified: every table's row count and checksum are equal in %s and the target\n",
		res.Rows, len(res.Tables), res.Elapsed.Seconds(), rate, backend.EmbeddedFile)
	fmt.Fprintln(e.stdout, "next, for every process of the PostgreSQL deployment:")
	if src.secretFile != "" {
		fmt.Fprintf(e.stdout, "  - the same deployment secret: BETTER_COMPUTE_SECRET=\"$(cat %s)\"\n", src.secretFile)
	} else {
		fmt.Fprintln(e.stdout, "  - the same deployment secret (the "+config.EnvSecret+" this command ran with)")
	}
	fmt.Fprintln(e.stdout, "  - the gateway certificate from the same CA, so that nodes trust it:")
	fmt.Fprintln(e.stdout, "      "+issueGatewayLine(to, src, gw))
	fmt.Fprintln(e.stdout, "    and host.gateway.tlsFiles pointing at gateway.crt and gateway.key there")
	fmt.Fprintln(e.stdout, "  - the same host.gateway.listen and publicURL as before: nodes dial the address they know")
	return nil
}

// progressPrinter prints a copy's progress on stderr, at most once a second
// per table and when a table is done.
func progressPrinter(e *env) func(transfer.Progress) {
	var last time.Time
	var table string
	return func(p transfer.Progress) {
		done := p.Copied == p.Total
		if p.Table == table && !done && time.Since(last) < time.Second {
			return
		}
		table, last = p.Table, time.Now()
		fmt.Fprintf(e.stderr, "copy %s: %d/%d rows\n", p.Table, p.Copied, p.Total)
	}
}

// gatewayCertNames are the --dns and --ip flags that reissue the embedded
// gateway's certificate at path for the same names; "--dns <gateway host>"
// when it cannot be read.
func gatewayCertNames(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "--dns <gateway host>"
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "--dns <gateway host>"
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "--dns <gateway host>"
	}
	var f []string
	for _, d := range c.DNSNames {
		f = append(f, "--dns "+d)
	}
	for _, ip := range c.IPAddresses {
		f = append(f, "--ip "+ip.String())
	}
	if len(f) == 0 {
		return "--dns <gateway host>"
	}
	return strings.Join(f, " ")
}

// issueGatewayLine is the pki issue-gateway command for the PostgreSQL
// deployment at target (its password, if any, left out).
func issueGatewayLine(target string, src *embeddedSource, names string) string {
	shown := redactURL(target)
	secret := "BETTER_COMPUTE_SECRET=..."
	if src.secretFile != "" {
		secret = fmt.Sprintf("BETTER_COMPUTE_SECRET=\"$(cat %s)\"", src.secretFile)
	}
	return fmt.Sprintf("%s=%s %s better-compute pki issue-gateway %s --out-dir /etc/better-compute/pki",
		config.EnvDatabaseURL, shellQuote(shown), secret, names)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
