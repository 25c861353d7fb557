package upgrade

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/installer/manifest"
)

// DefaultPinsFile is where the install script writes the pinned release
// keys, one pin a line.
const DefaultPinsFile = "/etc/bcd/release-pins"

// MaxBinarySize bounds the bcd binary an upgrade installs (512 MiB).
const MaxBinarySize = 512 << 20

// PrevSuffix names the previous binary kept beside the installed one:
// /usr/local/bin/bcd.prev.
const PrevSuffix = ".prev"

// InstallRequest is what an Installer installs: a downloaded bcd and the
// signed manifest that vouches for it. The installer verifies it again.
type InstallRequest struct {
	// Version is the release version asked for.
	Version string `json:"version"`
	// Staged is the path of the downloaded binary.
	Staged string `json:"staged"`
	// Manifest and Signature are the release manifest and its minisign
	// signature.
	Manifest  []byte `json:"manifest"`
	Signature []byte `json:"signature"`
}

// SwapParams are Swap's inputs.
type SwapParams struct {
	InstallRequest
	// Target is the installed binary to replace (/usr/local/bin/bcd).
	Target string
	// Pins are the trusted release key pins.
	Pins []string
	// Now is the time the manifest's expiry is checked at. Defaults to
	// time.Now.
	Now time.Time
	// OS and Arch select the manifest's binary. Default to runtime.GOOS and
	// runtime.GOARCH.
	OS, Arch string
}

// Swap verifies a release and installs its bcd binary at Target: the
// manifest's signature against Pins, its version and expiry, then the staged
// binary's size and sha256 against the manifest's binary entry for OS/Arch.
// It copies the binary into Target's folder (checking the digest of the bytes
// copied, so the staged file may not change under it), keeps the current
// Target as Target+".prev" and renames the copy over Target. On any error
// Target is unchanged.
func Swap(p SwapParams) (manifest.Artifact, error) {
	if p.Now.IsZero() {
		p.Now = time.Now()
	}
	if p.OS == "" {
		p.OS, p.Arch = runtime.GOOS, runtime.GOARCH
	}
	m, err := manifest.Verify(p.Manifest, p.Signature, p.Pins, p.Now)
	if err != nil {
		return manifest.Artifact{}, fmt.Errorf("release %s: %w", p.Version, err)
	}
	if m.Version != p.Version {
		return manifest.Artifact{}, fmt.Errorf("release %s: the signed manifest is for version %s", p.Version, m.Version)
	}
	a, ok := m.Find(manifest.KindBinary, "bcd", p.OS, p.Arch)
	if !ok {
		return manifest.Artifact{}, fmt.Errorf("release %s lists no bcd binary for %s/%s", p.Version, p.OS, p.Arch)
	}
	if a.Size > MaxBinarySize {
		return manifest.Artifact{}, fmt.Errorf("release %s: bcd is %d bytes, more than %d", p.Version, a.Size, MaxBinarySize)
	}
	if !filepath.IsAbs(p.Target) {
		return manifest.Artifact{}, fmt.Errorf("install bcd: target %q is not an absolute path", p.Target)
	}
	src, err := os.OpenFile(p.Staged, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return manifest.Artifact{}, fmt.Errorf("open downloaded bcd: %w", err)
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil || !fi.Mode().IsRegular() {
		return manifest.Artifact{}, fmt.Errorf("downloaded bcd %s is not a regular file", p.Staged)
	}
	mode := os.FileMode(0o755)
	if fi, err := os.Stat(p.Target); err == nil {
		mode = fi.Mode().Perm() | 0o111
	}
	tmp, err := copyBeside(p.Target, io.LimitReader(src, MaxBinarySize+1), mode, a.SHA256, a.Size)
	if err != nil {
		return manifest.Artifact{}, fmt.Errorf("release %s: %w", p.Version, err)
	}
	if err := keepPrevious(p.Target); err != nil {
		os.Remove(tmp)
		return manifest.Artifact{}, err
	}
	if err := os.Rename(tmp, p.Target); err != nil {
		os.Remove(tmp)
		return manifest.Artifact{}, fmt.Errorf("install bcd: %w", err)
	}
	syncDir(filepath.Dir(p.Target))
	return a, nil
}

// Restore puts target+".prev" back at target, atomically, and keeps it.
func Restore(target string) error {
	prev := target + PrevSuffix
	f, err := os.OpenFile(prev, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("restore previous bcd: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("restore previous bcd: %s is not a regular file", prev)
	}
	tmp := tempName(target)
	if err := os.Link(prev, tmp); err != nil {
		// A file system without hard links: copy.
		if tmp, err = copyBeside(target, f, fi.Mode().Perm(), "", fi.Size()); err != nil {
			return fmt.Errorf("restore previous bcd: %w", err)
		}
	}
	if err := os.Rename(tmp, target); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("restore previous bcd: %w", err)
	}
	syncDir(filepath.Dir(target))
	return nil
}

// keepPrevious makes target+".prev" the current target: a hard link, or a
// copy where the file system has none.
func keepPrevious(target string) error {
	prev := target + PrevSuffix
	tmp := tempName(target)
	if err := os.Link(target, tmp); err != nil {
		f, oerr := os.Open(target)
		if oerr != nil {
			return fmt.Errorf("keep the running bcd as %s: %w", prev, oerr)
		}
		defer f.Close()
		fi, serr := f.Stat()
		if serr != nil {
			return fmt.Errorf("keep the running bcd as %s: %w", prev, serr)
		}
		if tmp, err = copyBeside(target, f, fi.Mode().Perm(), "", fi.Size()); err != nil {
			return fmt.Errorf("keep the running bcd as %s: %w", prev, err)
		}
	}
	if err := os.Rename(tmp, prev); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("keep the running bcd as %s: %w", prev, err)
	}
	return nil
}

// copyBeside copies r into a new file in target's folder with mode, synced,
// and returns its name. When sum is set, the bytes copied must have that hex
// sha256 and size bytes; otherwise only size is checked.
func copyBeside(target string, r io.Reader, mode os.FileMode, sum string, size int64) (string, error) {
	name := tempName(target)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("write beside %s: %w", target, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch got := hex.EncodeToString(h.Sum(nil)); {
	case err != nil:
		err = fmt.Errorf("write beside %s: %w", target, err)
	case n != size:
		err = fmt.Errorf("bcd is %d bytes, but the signed manifest says %d: refusing to install it", n, size)
	case sum != "" && got != sum:
		err = fmt.Errorf("bcd has sha256 %s, but the signed manifest says %s: refusing to install it", got, sum)
	}
	if err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}

// tempName is a fresh hidden name beside target.
func tempName(target string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return filepath.Join(filepath.Dir(target), "."+filepath.Base(target)+".upgrade-"+hex.EncodeToString(b[:]))
}

// syncDir makes renames in dir durable; errors are ignored (some file
// systems refuse to sync a directory).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// ErrNoPins means no release key is pinned on this machine, so no release
// can be verified.
var ErrNoPins = errors.New("no release key is pinned on this machine")

// ReadPins reads a pin file: one pin ("sha256/<base64>") a line; blank lines
// and lines starting with "#" are ignored. A missing or empty file is an
// error wrapping ErrNoPins; a malformed pin names its line.
func ReadPins(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist (the install script writes it; or start bcd with --release-pins-file)", ErrNoPins, path)
	}
	if err != nil {
		return nil, fmt.Errorf("read release pins: %w", err)
	}
	var pins []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if _, err := manifest.ParsePin(s); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, line, err)
		}
		pins = append(pins, s)
	}
	if len(pins) == 0 {
		return nil, fmt.Errorf("%w: %s holds no pin", ErrNoPins, path)
	}
	return pins, nil
}
