package downloads

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/installer/manifest"
)

// Versions lists the versions of artifact the folder holds for Linux (amd64
// or arm64, as a build folder or an archive), newest first by semantic
// versioning (a pre-release before its release; build metadata ignored).
func (h *Handler) Versions(artifact string) []string {
	var candidates []string
	if d, err := h.root.Open("."); err == nil {
		entries, _ := d.ReadDir(-1)
		d.Close()
		for _, e := range entries {
			if e.IsDir() && manifest.ValidVersion(e.Name()) {
				candidates = append(candidates, e.Name())
			}
		}
	}
	for _, name := range []string{"metadata.json", "manifest.json"} {
		if b, err := h.readSmall(name); err == nil {
			var doc struct {
				Version string `json:"version"`
			}
			if json.Unmarshal(b, &doc) == nil && manifest.ValidVersion(doc.Version) && !slices.Contains(candidates, doc.Version) {
				candidates = append(candidates, doc.Version)
			}
		}
	}
	var out []string
	for _, v := range candidates {
		if h.hasLinux(artifact, v) {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return compareVersions(b, a) })
	return out
}

// hasLinux reports whether the release folder of version holds artifact
// for linux/amd64 or linux/arm64.
func (h *Handler) hasLinux(artifact, version string) bool {
	dir, ok := h.releaseDir(version)
	if !ok {
		return false
	}
	for _, arch := range []string{"amd64", "arm64"} {
		if _, ok := h.buildBinary(dir, artifact, "linux", arch); ok {
			return true
		}
		if _, err := h.root.Stat(path.Join(dir, fmt.Sprintf("%s_%s_linux_%s.tar.gz", artifact, version, arch))); err == nil {
			return true
		}
	}
	return false
}

// ErrNoManifest reports a release folder without a manifest and its
// signature.
var ErrNoManifest = errors.New("no signed release manifest")

// Manifest returns the release manifest of version (manifest.json) and its
// signature (manifest.json.minisig), as the route serves them. It fails
// with ErrNoManifest when either is missing.
func (h *Handler) Manifest(version string) (m, sig []byte, err error) {
	dir, ok := h.releaseDir(version)
	if !ok {
		return nil, nil, fmt.Errorf("version %s is not in the downloads folder", version)
	}
	m, err = h.readSmall(path.Join(dir, "manifest.json"))
	if err == nil {
		sig, err = h.readSmall(path.Join(dir, "manifest.json.minisig"))
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("%w for %s in the downloads folder", ErrNoManifest, version)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read the manifest of %s: %w", version, err)
	}
	return m, sig, nil
}

// compareVersions orders semantic versions (manifest.ValidVersion): -1 when
// a is older than b, 0 when equal, 1 when newer.
func compareVersions(a, b string) int {
	a, _, _ = strings.Cut(a, "+")
	b, _, _ = strings.Cut(b, "+")
	ac, apre, _ := strings.Cut(a, "-")
	bc, bpre, _ := strings.Cut(b, "-")
	ap, bp := strings.Split(ac, "."), strings.Split(bc, ".")
	for i := range min(len(ap), len(bp)) {
		if c := compareIdent(ap[i], bp[i]); c != 0 {
			return c
		}
	}
	switch {
	case apre == bpre:
		return 0
	case apre == "":
		return 1 // a release is newer than its pre-releases
	case bpre == "":
		return -1
	}
	as, bs := strings.Split(apre, "."), strings.Split(bpre, ".")
	for i := range min(len(as), len(bs)) {
		if c := compareIdent(as[i], bs[i]); c != 0 {
			return c
		}
	}
	return compareInt(len(as), len(bs))
}

// compareIdent compares numeric identifiers as numbers (and before
// alphanumeric ones), others as text.
func compareIdent(a, b string) int {
	an, aerr := strconv.ParseUint(a, 10, 64)
	bn, berr := strconv.ParseUint(b, 10, 64)
	switch {
	case aerr == nil && berr == nil:
		return compareInt(an, bn)
	case aerr == nil:
		return -1
	case berr == nil:
		return 1
	}
	return strings.Compare(a, b)
}

func compareInt[T int | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
