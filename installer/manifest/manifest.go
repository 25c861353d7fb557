package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Kinds of artifacts.
const (
	KindBinary    = "binary"    // an executable, as built (goreleaser's build folders)
	KindArchive   = "archive"   // a tar.gz or zip holding one binary
	KindPackage   = "package"   // a deb, rpm or apk
	KindChecksums = "checksums" // goreleaser's checksums.txt
)

// MaxSize bounds a manifest document (1 MiB): Parse refuses larger ones.
const MaxSize = 1 << 20

// Manifest is a release manifest: the version and every artifact of it.
type Manifest struct {
	// Version is the release version, without a leading "v" (0.1.0,
	// 0.1.1-snapshot-abc1234).
	Version string `json:"version"`
	// CreatedAt is when the manifest was made, UTC.
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt, when set, is when Verify stops accepting the manifest for
	// installs and upgrades.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Artifacts lists the files of the release, sorted by name.
	Artifacts []Artifact `json:"artifacts"`
}

// Artifact is one file of a release.
type Artifact struct {
	// Name is the file's slash-separated path relative to the dist folder.
	Name string `json:"name"`
	// OS and Arch are Go's GOOS and GOARCH; empty for the checksums file.
	OS   string `json:"os,omitempty"`
	Arch string `json:"arch,omitempty"`
	// SHA256 is the lower-case hex SHA-256 of the file.
	SHA256 string `json:"sha256"`
	// Size is the file's length in bytes.
	Size int64 `json:"size"`
	// Kind is one of the Kind constants; later releases may add kinds,
	// which older readers keep and ignore.
	Kind string `json:"kind"`
	// Binary names the program a binary, archive or package holds (bcd,
	// bcx-ipmi, better-compute).
	Binary string `json:"binary,omitempty"`
}

var (
	versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	tokenRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)
	hexRE     = regexp.MustCompile(`^[0-9a-f]{64}$`)
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$`)
)

// ValidVersion reports whether v is a release version this project uses:
// semantic versioning without a leading "v", at most 128 characters.
func ValidVersion(v string) bool { return len(v) <= 128 && versionRE.MatchString(v) }

// ValidName reports whether name is a clean relative slash path of at most
// 512 characters: no empty, "." or ".." element, no backslash, not absolute.
func ValidName(name string) bool {
	if len(name) == 0 || len(name) > 512 || !nameRE.MatchString(name) || path.Clean(name) != name {
		return false
	}
	for el := range strings.SplitSeq(name, "/") {
		if el == "." || el == ".." {
			return false
		}
	}
	return true
}

// Validate checks every field: the version, each artifact's name, digest,
// size, kind and platform, and that names are unique.
func (m *Manifest) Validate() error {
	if !ValidVersion(m.Version) {
		return fmt.Errorf("manifest: invalid version %q", m.Version)
	}
	if m.CreatedAt.IsZero() {
		return errors.New("manifest: created_at is missing")
	}
	if m.ExpiresAt != nil && !m.ExpiresAt.After(m.CreatedAt) {
		return errors.New("manifest: expires_at is not after created_at")
	}
	if len(m.Artifacts) == 0 {
		return errors.New("manifest: no artifacts")
	}
	seen := make(map[string]bool, len(m.Artifacts))
	for i, a := range m.Artifacts {
		switch {
		case !ValidName(a.Name):
			return fmt.Errorf("manifest: artifact %d: invalid name %q", i, a.Name)
		case seen[a.Name]:
			return fmt.Errorf("manifest: artifact %q listed twice", a.Name)
		case !hexRE.MatchString(a.SHA256):
			return fmt.Errorf("manifest: artifact %q: sha256 is not 64 lower-case hex digits", a.Name)
		case a.Size < 0:
			return fmt.Errorf("manifest: artifact %q: negative size", a.Name)
		case !tokenRE.MatchString(a.Kind):
			return fmt.Errorf("manifest: artifact %q: invalid kind %q", a.Name, a.Kind)
		case a.OS != "" && !tokenRE.MatchString(a.OS), a.Arch != "" && !tokenRE.MatchString(a.Arch):
			return fmt.Errorf("manifest: artifact %q: invalid os or arch", a.Name)
		case a.Binary != "" && !tokenRE.MatchString(a.Binary):
			return fmt.Errorf("manifest: artifact %q: invalid binary %q", a.Name, a.Binary)
		case a.Kind == KindBinary && (a.OS == "" || a.Arch == "" || a.Binary == ""):
			return fmt.Errorf("manifest: binary %q lacks os, arch or binary", a.Name)
		}
		seen[a.Name] = true
	}
	return nil
}

// Parse decodes and validates a manifest. Unknown fields are ignored so that
// older verifiers read newer manifests; wrong types, trailing data and
// documents over MaxSize are refused.
func Parse(b []byte) (*Manifest, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("manifest: larger than %d bytes", MaxSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if dec.More() {
		return nil, errors.New("manifest: trailing data after the document")
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Marshal validates m and encodes it, indented, with a final newline.
func (m *Manifest) Marshal() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return append(b, '\n'), nil
}

// Find returns the artifact of a kind for a program and platform: for
// KindBinary the executable, for KindArchive its archive. When several match
// (goreleaser's amd64 variants v1 and v3), the first listed wins; Build lists
// by name, so that is the most portable (v1).
func (m *Manifest) Find(kind, binary, goos, goarch string) (Artifact, bool) {
	i := slices.IndexFunc(m.Artifacts, func(a Artifact) bool {
		return a.Kind == kind && a.Binary == binary && a.OS == goos && a.Arch == goarch
	})
	if i < 0 {
		return Artifact{}, false
	}
	return m.Artifacts[i], true
}

// Expired reports whether m has an expiry at or before now.
func (m *Manifest) Expired(now time.Time) bool {
	return m.ExpiresAt != nil && !now.Before(*m.ExpiresAt)
}
