package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"
)

// BuildOptions describe the manifest Build makes.
type BuildOptions struct {
	// Version is the release version; required. When the folder holds
	// goreleaser's metadata.json, its version must agree.
	Version string
	// Now is the creation time. Defaults to time.Now.
	Now time.Time
	// TTL, when positive, sets ExpiresAt to Now+TTL.
	TTL time.Duration
}

// These name goreleaser's files (and ours) that are not artifacts.
var skipNames = map[string]bool{
	"artifacts.json": true, "metadata.json": true, "config.yaml": true,
	"manifest.json": true, "manifest.json.minisig": true,
}

var (
	// buildDirRE matches goreleaser's build folders: bcd_linux_amd64_v1.
	buildDirRE = regexp.MustCompile(`^([a-z0-9][a-z0-9-]*)_([a-z0-9]+)_([a-z0-9]+)(_[A-Za-z0-9.]+)?$`)
	// platformRE matches the tail of archive and package names: linux_amd64.
	platformRE = regexp.MustCompile(`^([a-z0-9]+)_([a-z0-9]+)$`)
)

// Build walks a goreleaser dist folder (or a mirror of one) and lists its
// artifacts with their digests:
//
//   - <program>_<os>_<arch>[_<variant>]/<program>: a binary;
//   - <program>_<version>_<os>_<arch>.tar.gz (or .zip): an archive;
//   - <package>_<version>_<os>_<arch>.deb (.rpm, .apk): a package;
//   - checksums.txt: the checksums file.
//
// Other files, goreleaser's metadata and symbolic links are left out.
func Build(dist string, opts BuildOptions) (*Manifest, error) {
	if !ValidVersion(opts.Version) {
		return nil, fmt.Errorf("manifest: invalid version %q (want semantic versioning without a leading v, like 0.1.0)", opts.Version)
	}
	if err := checkMetadata(dist, opts.Version); err != nil {
		return nil, err
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	now = now.UTC().Truncate(time.Second)
	m := &Manifest{Version: opts.Version, CreatedAt: now}
	if opts.TTL > 0 {
		exp := now.Add(opts.TTL)
		m.ExpiresAt = &exp
	}
	root := os.DirFS(dist)
	err := fs.WalkDir(root, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		depth := strings.Count(name, "/")
		if d.IsDir() {
			if name != "." && depth > 0 {
				return fs.SkipDir // build folders hold their binary at the top
			}
			return nil
		}
		if !d.Type().IsRegular() || !ValidName(name) {
			return nil
		}
		a, ok := classify(name, opts.Version)
		if !ok {
			return nil
		}
		a.SHA256, a.Size, err = digestFile(root, name)
		if err != nil {
			return err
		}
		m.Artifacts = append(m.Artifacts, a)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("manifest: read %s: %w", dist, err)
	}
	if len(m.Artifacts) == 0 {
		return nil, fmt.Errorf("manifest: no release artifacts in %s (want a goreleaser dist folder)", dist)
	}
	slices.SortFunc(m.Artifacts, func(a, b Artifact) int { return strings.Compare(a.Name, b.Name) })
	return m, m.Validate()
}

// classify names the artifact a dist file is, if any.
func classify(name, version string) (Artifact, bool) {
	a := Artifact{Name: name}
	if dir, file, ok := strings.Cut(name, "/"); ok {
		sm := buildDirRE.FindStringSubmatch(dir)
		if sm == nil || sm[1] != file && sm[1] != strings.TrimSuffix(file, ".exe") {
			return a, false
		}
		a.Kind, a.Binary, a.OS, a.Arch = KindBinary, file, sm[2], sm[3]
		return a, true
	}
	if name == "checksums.txt" || strings.HasSuffix(name, "_checksums.txt") {
		a.Kind = KindChecksums
		return a, true
	}
	if skipNames[name] {
		return a, false
	}
	for _, ext := range []string{".tar.gz", ".tgz", ".zip", ".deb", ".rpm", ".apk"} {
		stem, ok := strings.CutSuffix(name, ext)
		if !ok {
			continue
		}
		// <program>_<version>_<os>_<arch>
		program, platform, ok := strings.Cut(stem, "_"+version+"_")
		sm := platformRE.FindStringSubmatch(platform)
		if !ok || sm == nil || program == "" {
			return a, false
		}
		a.Kind = KindArchive
		if ext == ".deb" || ext == ".rpm" || ext == ".apk" {
			a.Kind = KindPackage
		}
		a.Binary, a.OS, a.Arch = program, sm[1], sm[2]
		return a, true
	}
	return a, false
}

// checkMetadata compares the version with goreleaser's metadata.json when
// there is one.
func checkMetadata(dist, version string) error {
	b, err := os.ReadFile(path.Join(dist, "metadata.json"))
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(dist); err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	var md struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(b, &md); err != nil {
		return fmt.Errorf("manifest: read %s/metadata.json: %w", dist, err)
	}
	if md.Version != "" && md.Version != version {
		return fmt.Errorf("manifest: %s holds version %s (metadata.json), not %s", dist, md.Version, version)
	}
	return nil
}

// digestFile returns a file's hex SHA-256 and size.
func digestFile(root fs.FS, name string) (string, int64, error) {
	f, err := root.Open(name)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
