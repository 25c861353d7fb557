package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/installer/manifest"
)

// envReleaseKeyPassword, when set, encrypts the key release keygen writes
// and decrypts the key release sign reads.
const envReleaseKeyPassword = "BETTER_COMPUTE_RELEASE_KEY_PASSWORD"

// releaseCmd groups the release manifest commands (docs/releases.md).
func releaseCmd(e *env) *cobra.Command {
	c := &cobra.Command{
		Use:   "release",
		Short: "Make, sign and verify release manifests",
	}
	c.AddCommand(releaseKeygenCmd(e), releaseManifestCmd(e), releaseSignCmd(e), releaseVerifyCmd(e), releasePinsCmd(e))
	return c
}

// releasePinsCmd groups the release pin statement commands
// (docs/releases.md, "Pin statements").
func releasePinsCmd(e *env) *cobra.Command {
	c := &cobra.Command{
		Use:   "pins",
		Short: "Sign release pin statements and send them to every node (add, remove), and see which nodes hold a pin",
	}
	c.AddCommand(releasePinsSignCmd(e), releasePinsAddCmd(e), releasePinsStatusCmd(e), releasePinsRemoveCmd(e))
	return c
}

func releasePinsSignCmd(e *env) *cobra.Command {
	var keyPath, add, remove, out string
	c := &cobra.Command{
		Use:   "sign --key F (--add PIN | --remove PIN) --out FILE",
		Short: "Sign a statement that adds or removes a release pin: FILE and FILE.minisig",
		Long: `sign writes a pin statement (FILE) and its minisign signature
(FILE.minisig) with --key, a release key the machines already pin: bcd
applies a statement only when its own pin file names the signing key, so a
new key is vouched for by an old one, never by itself. Keep the key off the
machines that serve releases; sign where it is kept.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			action, pin := manifest.PinAdd, add
			switch {
			case keyPath == "" || out == "":
				return usageError{errors.New("--key and --out are required")}
			case (add == "") == (remove == ""):
				return usageError{errors.New("give one of --add PIN or --remove PIN")}
			case remove != "":
				action, pin = manifest.PinRemove, remove
			}
			if _, err := manifest.ParsePin(pin); err != nil {
				return usageError{err}
			}
			kb, err := os.ReadFile(keyPath)
			if err != nil {
				return err
			}
			sk, err := manifest.ParsePrivateKey(kb, e.getenv(envReleaseKeyPassword))
			if err != nil {
				return err
			}
			pk, err := manifest.PublicKeyOf(sk)
			if err != nil {
				return err
			}
			if signer := manifest.Pin(pk); action == manifest.PinAdd && signer == pin {
				return usageError{fmt.Errorf("--key is the key %s adds: a key cannot vouch for itself; sign with a key the machines already pin", pin)}
			}
			doc, sig, err := manifest.SignPinStatement(action, pin, sk, time.Now())
			if err != nil {
				return usageError{err}
			}
			if err := replaceFile(out, doc, 0o644); err != nil {
				return err
			}
			if err := replaceFile(out+".minisig", sig, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "wrote %s and %s: %s %s, signed by %s\n", out, out+".minisig", action, pin, manifest.Pin(pk))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&keyPath, "key", "", "minisign private key the machines already pin (env "+envReleaseKeyPassword+" decrypts an encrypted one)")
	f.StringVar(&add, "add", "", "pin to add, sha256/...")
	f.StringVar(&remove, "remove", "", "pin to remove, sha256/...")
	f.StringVar(&out, "out", "", "statement file to write (and OUT.minisig)")
	return c
}

func releaseKeygenCmd(e *env) *cobra.Command {
	var outDir, outKey string
	c := &cobra.Command{
		Use:   "keygen --out FILE | --out-dir DIR",
		Short: "Make a minisign release key: FILE (0600) and FILE.pub, or DIR/release.key and DIR/release.pub; prints its pin",
		Long: `keygen makes an Ed25519 minisign key pair: the secret key (mode 0600, in
minisign's format, encrypted when ` + envReleaseKeyPassword + ` is set) and
the public key (.pub, as minisign -G writes it). It prints the key's pin,
sha256/..., which release verify --pins, daemon install-script
--release-pins and bcd's release pins take. It never overwrites a key.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var keyPath, pubPath string
			switch {
			case outKey != "" && outDir != "":
				return usageError{errors.New("give --out or --out-dir, not both")}
			case outKey != "":
				keyPath, pubPath = outKey, outKey+".pub"
			case outDir != "":
				keyPath, pubPath = filepath.Join(outDir, "release.key"), filepath.Join(outDir, "release.pub")
			default:
				return usageError{errors.New("--out FILE (writes FILE and FILE.pub) or --out-dir DIR is required")}
			}
			pub, priv, pin, err := manifest.GenerateKey(e.getenv(envReleaseKeyPassword))
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(keyPath), 0o700); err != nil {
				return err
			}
			for _, p := range []string{keyPath, pubPath} {
				if _, err := os.Lstat(p); err == nil {
					return fmt.Errorf("%s exists; not overwriting a release key", p)
				}
			}
			if err := createFile(keyPath, priv, 0o600); err != nil {
				return err
			}
			if err := createFile(pubPath, pub, 0o644); err != nil {
				os.Remove(keyPath) // no secret key without its public key
				return err
			}
			fmt.Fprintf(e.stdout, "private key: %s\npublic key:  %s\npin:         %s\n", keyPath, pubPath, pin)
			return nil
		},
	}
	c.Flags().StringVar(&outKey, "out", "", "secret key file to write (mode 0600); the public key goes to FILE.pub")
	c.Flags().StringVar(&outDir, "out-dir", "", "folder for release.key and release.pub")
	return c
}

func releaseManifestCmd(e *env) *cobra.Command {
	var dist, ver, out string
	var ttl time.Duration
	c := &cobra.Command{
		Use:   "manifest --dist DIR --version V [--expires 720h] [--out F]",
		Short: "List a goreleaser dist folder's artifacts with their sha256 in a release manifest",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if dist == "" || ver == "" {
				return usageError{errors.New("--dist and --version are required")}
			}
			if ttl < 0 {
				return usageError{errors.New("--expires must not be negative")}
			}
			m, err := manifest.Build(dist, manifest.BuildOptions{Version: ver, TTL: ttl})
			if err != nil {
				return err
			}
			b, err := m.Marshal()
			if err != nil {
				return err
			}
			if out == "" {
				out = filepath.Join(dist, "manifest.json")
			}
			if err := replaceFile(out, b, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "wrote %s: version %s, %d artifacts\n", out, m.Version, len(m.Artifacts))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&dist, "dist", "", "goreleaser dist folder")
	f.StringVar(&ver, "version", "", "release version (as goreleaser's metadata.json names it)")
	f.DurationVar(&ttl, "expires", 0, "expire the manifest for installs and upgrades after this long (0: never)")
	f.StringVar(&out, "out", "", "manifest file (default DIST/manifest.json)")
	return c
}

func releaseSignCmd(e *env) *cobra.Command {
	var keyPath, in, out string
	c := &cobra.Command{
		Use:   "sign --key F --in manifest.json [--out manifest.json.minisig]",
		Short: "Sign a release manifest with a minisign key",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if keyPath == "" || in == "" {
				return usageError{errors.New("--key and --in are required")}
			}
			kb, err := os.ReadFile(keyPath)
			if err != nil {
				return err
			}
			sk, err := manifest.ParsePrivateKey(kb, e.getenv(envReleaseKeyPassword))
			if err != nil {
				return err
			}
			doc, err := os.ReadFile(in)
			if err != nil {
				return err
			}
			sig, err := manifest.Sign(doc, sk, time.Now())
			if err != nil {
				return err
			}
			if out == "" {
				out = in + ".minisig"
			}
			if err := replaceFile(out, sig, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "wrote %s\n", out)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&keyPath, "key", "", "minisign private key (env "+envReleaseKeyPassword+" decrypts an encrypted one)")
	f.StringVar(&in, "in", "", "manifest to sign")
	f.StringVar(&out, "out", "", "signature file (default IN.minisig)")
	return c
}

func releaseVerifyCmd(e *env) *cobra.Command {
	var in, sigPath string
	var pins []string
	c := &cobra.Command{
		Use:   "verify --pins sha256/... --in manifest.json [--sig F]",
		Short: "Verify a release manifest's signature against pinned keys, and its expiry",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if in == "" || len(pins) == 0 {
				return usageError{errors.New("--in and --pins are required")}
			}
			if sigPath == "" {
				sigPath = in + ".minisig"
			}
			doc, err := os.ReadFile(in)
			if err != nil {
				return err
			}
			sig, err := os.ReadFile(sigPath)
			if err != nil {
				return err
			}
			m, err := manifest.Verify(doc, sig, pins, time.Now())
			if err != nil {
				return fmt.Errorf("%s: %w", in, err)
			}
			exp := "never"
			if m.ExpiresAt != nil {
				exp = m.ExpiresAt.Format(time.RFC3339)
			}
			fmt.Fprintf(e.stdout, "verified %s: version %s, %d artifacts, expires %s\n", in, m.Version, len(m.Artifacts), exp)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&in, "in", "", "manifest to verify")
	f.StringVar(&sigPath, "sig", "", "signature file (default IN.minisig)")
	f.StringSliceVar(&pins, "pins", nil, "trusted key pins, sha256/... (repeat or comma-separate: any one may sign)")
	return c
}

// createFile creates a file that must not exist yet.
func createFile(p string, b []byte, mode fs.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// replaceFile replaces a file through a temporary file and a rename.
func replaceFile(p string, b []byte, mode fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}
