package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/installer"
)

// daemonCmd groups the commands about installing bcd on machines.
func daemonCmd(e *env) *cobra.Command {
	c := &cobra.Command{
		Use:   "daemon",
		Short: "Install bcd on machines",
	}
	c.AddCommand(installScriptCmd(e))
	return c
}

func installScriptCmd(e *env) *cobra.Command {
	var (
		o                     installer.Options
		manifestPath, sigPath string
		out                   string
	)
	c := &cobra.Command{
		Use:   "install-script --pool P --site S --gateway-url URL --base-url URL --bcd-version V [--release-manifest F --release-pins P...] [--install-plugins bcx-ipmi] [--unprivileged] --out F",
		Short: "Write the POSIX sh script that installs bcd on a machine and joins it (docs/install.md)",
		Long: `install-script writes a POSIX sh script that a site admin runs as root (or
pipes to sh): it detects the architecture, downloads bcd from the control
plane's downloads route, checks it, installs it into /usr/local/bin, writes
the systemd units, joins with a join token (BCD_JOIN_TOKEN, --token-file or
the terminal) and starts bcd.

With --release-manifest and --release-pins, the manifest's signature is
verified here against the pins, and the script pins the sha256 of every
binary it may download: it installs nothing else. See docs/install.md.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if out == "" {
				return usageError{errors.New("--out is required (- for standard output)")}
			}
			if manifestPath != "" {
				b, err := os.ReadFile(manifestPath)
				if err != nil {
					return usageError{fmt.Errorf("--release-manifest: %w", err)}
				}
				o.Manifest = b
				if sigPath == "" {
					sigPath = manifestPath + ".minisig"
				}
			}
			if sigPath != "" {
				if manifestPath == "" {
					return usageError{errors.New("--release-signature needs --release-manifest")}
				}
				b, err := os.ReadFile(sigPath)
				if err != nil {
					return usageError{fmt.Errorf("--release-manifest's signature: %w", err)}
				}
				o.Signature = b
			}
			o.Now = time.Now()
			script, err := installer.Generate(o)
			if err != nil {
				return usageError{err}
			}
			if out == "-" {
				_, err := e.stdout.Write(script)
				return err
			}
			if err := replaceFile(out, script, 0o755); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "wrote %s: installs bcd %s, joins pool %s through %s\n", out, o.Version, o.Pool, o.GatewayURL)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&o.Pool, "pool", "", "pool the machine joins (required)")
	f.StringVar(&o.Site, "site", "", "site of the pool (required)")
	f.StringVar(&o.GatewayURL, "gateway-url", "", "gateway URL, https://host[:port] (required)")
	f.StringVar(&o.BaseURL, "base-url", "", "control plane URL the downloads route answers on, https://host (required)")
	f.StringVar(&o.BasePath, "base-path", "/api", "the API's base path on --base-url")
	f.StringVar(&o.Version, "bcd-version", "", "bcd release to install, like 0.1.0 (required)")
	f.StringVar(&manifestPath, "release-manifest", "", "signed release manifest (manifest.json; its signature is manifest.json.minisig)")
	f.StringVar(&sigPath, "release-signature", "", "signature of --release-manifest (default MANIFEST.minisig)")
	f.StringSliceVar(&o.Pins, "release-pins", nil, "pins of the keys trusted to sign releases, sha256/... (repeat or comma-separate)")
	f.StringSliceVar(&o.Plugins, "install-plugins", nil, "plugins to install beside bcd: bcx-ipmi")
	f.BoolVar(&o.Unprivileged, "unprivileged", false, "run bcd as the user bcd beside a root bcd helper")
	f.StringVar(&out, "out", "", "script file to write, - for standard output (required)")
	return c
}
