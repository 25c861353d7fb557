package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/installer"
	"github.com/better-compute/better-compute/installer/manifest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
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

// checkPlacement checks through the API that pool and site (ids or names;
// either may be empty) exist and that the pool is at the site. A missing
// one is a usage error that lists the existing ones.
func checkPlacement(ctx context.Context, c *client.Client, pool, site string) error {
	sites, err := listSites(ctx, c)
	if err != nil {
		return fmt.Errorf("check --site and --pool on the control plane (leave both out to let the join token decide): %w", err)
	}
	var wantSite *apiv1.Site
	if site != "" {
		if wantSite, err = findNamed(sites, "--site", site, "site", "none (better-compute sites create)"); err != nil {
			return err
		}
	}
	if pool == "" {
		return nil
	}
	pools, err := listPools(ctx, c)
	if err != nil {
		return fmt.Errorf("check --pool on the control plane (leave it out to let the join token decide): %w", err)
	}
	p, err := findNamed(pools, "--pool", pool, "pool", "none (better-compute pools create)")
	if err != nil {
		return err
	}
	if wantSite != nil && p.SiteId != wantSite.Id {
		at := p.SiteId
		if j := slices.IndexFunc(sites, func(s *apiv1.Site) bool { return s.Id == p.SiteId }); j >= 0 {
			at = sites[j].Name
		}
		return usageError{fmt.Errorf("--pool %s is at site %s, not --site %s", pool, at, site)}
	}
	return nil
}

// idNamed is an API object with an id and a name (a site, a pool).
type idNamed interface {
	GetId() string
	GetName() string
}

// findNamed is the item of items (sites, pools) whose id or name is v, the
// value of flag; when there is none, a usage error listing them as
// "name (id)", sorted, or none when there are none at all.
func findNamed[T idNamed](items []T, flag, v, what, none string) (T, error) {
	if i := slices.IndexFunc(items, func(x T) bool { return x.GetId() == v || x.GetName() == v }); i >= 0 {
		return items[i], nil
	}
	names := make([]string, 0, len(items))
	for _, x := range items {
		names = append(names, x.GetName()+" ("+x.GetId()+")")
	}
	slices.Sort(names)
	var zero T
	return zero, usageError{fmt.Errorf("%s %s: no such %s on the control plane; %ss: %s", flag, v, what, what, listOrNone(names, none))}
}

func listOrNone(names []string, none string) string {
	if len(names) == 0 {
		return none
	}
	return strings.Join(names, ", ")
}

// scriptError is the error of an installer.Generate failure: a release
// manifest that does not verify against the pins (a key not pinned, a bad
// signature, expired) fails the command (exit 1), as any verification does;
// anything else is an option in error (exit 2).
func scriptError(err error) error {
	if errors.Is(err, manifest.ErrUnpinnedKey) || errors.Is(err, manifest.ErrBadSignature) || errors.Is(err, manifest.ErrExpired) {
		return err
	}
	return usageError{err}
}

func installScriptCmd(e *env) *cobra.Command {
	var (
		o                     installer.Options
		manifestPath, sigPath string
		out                   string
		af                    apiFlags
	)
	c := &cobra.Command{
		Use:   "install-script [--pool P --site S] --gateway-url URL --base-url URL --bcd-version V [--release-manifest F --release-pins P...] [--install-plugins bcx-ipmi] [--unprivileged] --out F",
		Short: "Write the POSIX sh script that installs bcd on a machine and joins it (docs/install.md)",
		Long: `install-script writes a POSIX sh script that a site admin runs as root (or
pipes to sh): it detects the architecture, downloads bcd from the control
plane's downloads route, checks it, installs it into /usr/local/bin, writes
the systemd units, joins with a join token (BCD_JOIN_TOKEN, --token-file or
the terminal) and starts bcd.

With --release-manifest and --release-pins, the manifest's signature is
verified here against the pins, and the script pins the sha256 of every
binary it may download: it installs nothing else. With --pinned-pubkey every
download uses curl with that TLS key pinned.

The join token decides where the machine joins; --pool and --site, when
given, are checked on the control plane (through the API: --server and
--token) and written into the script as what is asked. See docs/install.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			if _, err := installer.Generate(o); err != nil {
				return scriptError(err)
			}
			if o.Pool != "" || o.Site != "" {
				c, err := e.client(&af)
				if err != nil {
					return err
				}
				if err := checkPlacement(cmd.Context(), c, o.Pool, o.Site); err != nil {
					return err
				}
			}
			script, err := installer.Generate(o)
			if err != nil {
				return scriptError(err)
			}
			if out == "-" {
				_, err := e.stdout.Write(script)
				return err
			}
			if err := replaceFile(out, script, 0o755); err != nil {
				return err
			}
			where := "the pool its join token names"
			if o.Pool != "" {
				where = "pool " + o.Pool
			}
			fmt.Fprintf(e.stderr, "wrote %s: installs bcd %s, joins %s through %s\n", out, o.Version, where, o.GatewayURL)
			return nil
		},
	}
	af.add(c)
	f := c.Flags()
	f.StringVar(&o.Pool, "pool", "", "pool the machine is meant to join, checked on the control plane (default: the join token decides)")
	f.StringVar(&o.Site, "site", "", "site of the pool, checked on the control plane (default: the join token decides)")
	f.StringVar(&o.GatewayURL, "gateway-url", "", "gateway URL, https://host[:port] (required)")
	f.StringVar(&o.BaseURL, "base-url", "", "control plane URL the downloads route answers on, https://host (required)")
	f.StringVar(&o.BasePath, "base-path", "/api", "the API's base path on --base-url")
	f.StringVar(&o.Version, "bcd-version", "", "bcd release to install, like 0.1.0 (required)")
	f.StringVar(&manifestPath, "release-manifest", "", "signed release manifest (manifest.json; its signature is manifest.json.minisig)")
	f.StringVar(&sigPath, "release-signature", "", "signature of --release-manifest (default MANIFEST.minisig)")
	f.StringSliceVar(&o.Pins, "release-pins", nil, "pins of the keys trusted to sign releases, sha256/... (repeat or comma-separate)")
	f.StringSliceVar(&o.Plugins, "install-plugins", nil, "plugins to install beside bcd: bcx-ipmi")
	f.BoolVar(&o.Unprivileged, "unprivileged", false, "run bcd as the user bcd beside a root bcd helper")
	f.StringVar(&o.PinnedPubKey, "pinned-pubkey", "", "pin of --base-url's TLS key, curl's sha256//BASE64 form: every download uses curl -k --pinnedpubkey")
	f.BoolVar(&o.AllowHTTP, "allow-plain-http", false, "allow an http:// --base-url that is not loopback (needs --release-manifest)")
	f.StringVar(&out, "out", "", "script file to write, - for standard output (required)")
	return c
}
