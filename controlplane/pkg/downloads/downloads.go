package downloads

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/installer/manifest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Artifacts are the programs the route serves.
var Artifacts = []string{"bcd", "bcx-ipmi"}

// Config configures the downloads handler.
type Config struct {
	// Dir is the downloads folder (downloads.dir); required.
	Dir string
	// BasePath is the API's base path. Defaults to /api.
	BasePath string
	// MaxArchiveBinary bounds a binary extracted from an archive and kept
	// in memory. Defaults to 512 MiB.
	MaxArchiveBinary int64
	// Log receives request failures. Defaults to slog.Default().
	Log *slog.Logger
}

// Handler serves the downloads route. It is safe for concurrent use.
type Handler struct {
	cfg    Config
	prefix string
	root   *os.Root
	log    *slog.Logger

	mu      sync.Mutex
	digests map[fileKey]string     // hex sha256 of files, by identity
	blobs   map[fileKey]*extracted // binaries extracted from archives
}

// fileKey identifies one version of a file.
type fileKey struct {
	name    string
	size    int64
	modTime time.Time
}

type extracted struct {
	data    []byte
	modTime time.Time
	sha256  string
}

// New opens the folder and returns a handler; Close releases it.
func New(cfg Config) (*Handler, error) {
	if cfg.Dir == "" {
		return nil, errors.New("downloads: no folder configured")
	}
	cfg.BasePath = strings.TrimSuffix(cmp.Or(cfg.BasePath, "/api"), "/")
	cfg.MaxArchiveBinary = cmp.Or(cfg.MaxArchiveBinary, 512<<20)
	root, err := os.OpenRoot(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("downloads: open %s: %w", cfg.Dir, err)
	}
	return &Handler{
		cfg: cfg, prefix: cfg.BasePath + "/downloads/", root: root, log: cmp.Or(cfg.Log, slog.Default()),
		digests: map[fileKey]string{}, blobs: map[fileKey]*extracted{},
	}, nil
}

// Close releases the folder.
func (h *Handler) Close() error { return h.root.Close() }

var (
	platformRE = regexp.MustCompile(`^([a-z0-9]{1,16})-([a-z0-9]{1,16})$`)
	// encodedRE finds percent-encoded dots, slashes and backslashes, which
	// no valid download path has.
	encodedRE = regexp.MustCompile(`(?i)%(2e|2f|5c|00)`)
)

// ServeHTTP serves GET and HEAD requests under {basePath}/downloads/.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, apiv1.CodeInvalidArgument, "downloads answer GET and HEAD only")
		return
	}
	raw := r.URL.EscapedPath()
	rest, ok := strings.CutPrefix(raw, h.prefix)
	if !ok || encodedRE.MatchString(raw) || strings.ContainsAny(rest, `\`+"\x00") {
		writeError(w, http.StatusBadRequest, apiv1.CodeInvalidArgument, "invalid download path")
		return
	}
	parts := strings.Split(rest, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			writeError(w, http.StatusBadRequest, apiv1.CodeInvalidArgument, "invalid download path")
			return
		}
	}
	if len(parts) != 3 {
		writeError(w, http.StatusNotFound, apiv1.CodeNotFound, "no download here: want downloads/{artifact}/{version}/{os}-{arch} or .../manifest.json")
		return
	}
	artifact, version, leaf := parts[0], parts[1], parts[2]
	if !slices.Contains(Artifacts, artifact) {
		writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("unknown artifact %q (known: %s)", artifact, strings.Join(Artifacts, ", ")))
		return
	}
	if !manifest.ValidVersion(version) {
		writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("unknown version %q", version))
		return
	}
	dir, ok := h.releaseDir(version)
	if !ok {
		writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("version %s is not in the downloads folder", version))
		return
	}
	switch leaf {
	case "manifest.json", "manifest.json.minisig":
		h.serveFile(w, r, path.Join(dir, leaf), leaf)
		return
	}
	m := platformRE.FindStringSubmatch(leaf)
	if m == nil {
		writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("unknown download %q: want {os}-{arch} (linux-amd64), manifest.json or manifest.json.minisig", leaf))
		return
	}
	goos, goarch := m[1], m[2]
	if name, ok := h.buildBinary(dir, artifact, goos, goarch); ok {
		h.serveFile(w, r, name, artifact)
		return
	}
	archive := path.Join(dir, fmt.Sprintf("%s_%s_%s_%s.tar.gz", artifact, version, goos, goarch))
	if _, err := h.root.Stat(archive); err == nil {
		h.serveArchived(w, r, archive, artifact)
		return
	}
	writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("no %s %s for %s/%s", artifact, version, goos, goarch))
}

// releaseDir finds the folder of a version: dir/<version>, or the folder
// itself when its metadata.json or manifest.json names the version.
func (h *Handler) releaseDir(version string) (string, bool) {
	if fi, err := h.root.Stat(version); err == nil && fi.IsDir() {
		return version, true
	}
	for _, name := range []string{"metadata.json", "manifest.json"} {
		b, err := h.readSmall(name)
		if err != nil {
			continue
		}
		var doc struct {
			Version string `json:"version"`
		}
		if json.Unmarshal(b, &doc) == nil && doc.Version == version {
			return ".", true
		}
	}
	return "", false
}

// readSmall reads a file of at most 1 MiB.
func (h *Handler) readSmall(name string) ([]byte, error) {
	f, err := h.root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, manifest.MaxSize))
}

// buildBinary finds <artifact>_<os>_<arch>[_<variant>]/<artifact> in dir.
func (h *Handler) buildBinary(dir, artifact, goos, goarch string) (string, bool) {
	d, err := h.root.Open(dir)
	if err != nil {
		return "", false
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return "", false
	}
	stem := artifact + "_" + goos + "_" + goarch
	var dirs []string
	for _, e := range entries {
		n := e.Name()
		if n == stem || strings.HasPrefix(n, stem+"_") && !strings.Contains(n[len(stem)+1:], "_") {
			dirs = append(dirs, n)
		}
	}
	slices.Sort(dirs)
	for _, n := range dirs {
		name := path.Join(dir, n, artifact)
		if fi, err := h.root.Stat(name); err == nil && fi.Mode().IsRegular() {
			return name, true
		}
	}
	return "", false
}

// serveFile serves a regular file of the folder.
func (h *Handler) serveFile(w http.ResponseWriter, r *http.Request, name, download string) {
	f, err := h.root.Open(name)
	if err != nil {
		h.openFailed(w, r, name, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("no %s here", download))
		return
	}
	key := fileKey{name: name, size: fi.Size(), modTime: fi.ModTime()}
	sum, err := h.fileDigest(key, f)
	if err != nil {
		h.log.ErrorContext(r.Context(), "Download digest failed", "file", name, logkey.Err, err)
		writeError(w, http.StatusInternalServerError, apiv1.CodeInternal, "internal error")
		return
	}
	h.serve(w, r, download, fi.ModTime(), sum, f)
}

// fileDigest returns the hex sha256 of a file, computed once per version.
func (h *Handler) fileDigest(key fileKey, f *os.File) (string, error) {
	h.mu.Lock()
	sum, ok := h.digests[key]
	h.mu.Unlock()
	if ok {
		return sum, nil
	}
	d := sha256.New()
	if _, err := io.Copy(d, f); err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	sum = hex.EncodeToString(d.Sum(nil))
	h.mu.Lock()
	if len(h.digests) > 4096 {
		clear(h.digests)
	}
	h.digests[key] = sum
	h.mu.Unlock()
	return sum, nil
}

// serveArchived serves the binary inside a goreleaser archive.
func (h *Handler) serveArchived(w http.ResponseWriter, r *http.Request, archive, artifact string) {
	f, err := h.root.Open(archive)
	if err != nil {
		h.openFailed(w, r, archive, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("no %s here", artifact))
		return
	}
	key := fileKey{name: archive, size: fi.Size(), modTime: fi.ModTime()}
	h.mu.Lock()
	blob := h.blobs[key]
	h.mu.Unlock()
	if blob == nil {
		blob, err = extract(f, artifact, h.cfg.MaxArchiveBinary)
		if err != nil {
			h.log.WarnContext(r.Context(), "Download archive unreadable", "file", archive, logkey.Err, err)
			writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("no %s in %s", artifact, path.Base(archive)))
			return
		}
		h.mu.Lock()
		if len(h.blobs) >= 8 { // a few binaries of current releases
			clear(h.blobs)
		}
		h.blobs[key] = blob
		h.mu.Unlock()
	}
	h.serve(w, r, artifact, blob.modTime, blob.sha256, bytes.NewReader(blob.data))
}

// extract reads the regular file named artifact (at any depth) from a
// tar.gz archive.
func extract(r io.Reader, artifact string, limit int64) (*extracted, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fs.ErrNotExist
		}
		if err != nil {
			return nil, err
		}
		if hdr.Typeflag != tar.TypeReg || path.Base(hdr.Name) != artifact {
			continue
		}
		if hdr.Size > limit {
			return nil, fmt.Errorf("%s is %d bytes, over the %d limit", hdr.Name, hdr.Size, limit)
		}
		data, err := io.ReadAll(io.LimitReader(tr, limit))
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		return &extracted{data: data, modTime: hdr.ModTime, sha256: hex.EncodeToString(sum[:])}, nil
	}
}

// serve writes the headers every download carries and the content, with
// ranges and conditional requests handled by http.ServeContent.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, download string, modTime time.Time, sumHex string, content io.ReadSeeker) {
	raw, _ := hex.DecodeString(sumHex)
	b64 := base64.StdEncoding.EncodeToString(raw)
	hdr := w.Header()
	hdr.Set("ETag", `"sha256-`+sumHex+`"`)
	hdr.Set("Repr-Digest", "sha-256=:"+b64+":")
	hdr.Set("Digest", "SHA-256="+b64)
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Content-Type-Options", "nosniff")
	switch {
	case strings.HasSuffix(download, ".json"):
		hdr.Set("Content-Type", "application/json")
	case strings.HasSuffix(download, ".minisig"):
		hdr.Set("Content-Type", "text/plain; charset=utf-8")
	default:
		hdr.Set("Content-Type", "application/octet-stream")
		hdr.Set("Content-Disposition", `attachment; filename="`+download+`"`)
	}
	http.ServeContent(w, r, "", modTime, content)
}

// openFailed answers a file that could not be opened: absent, or outside
// the folder (a symbolic link out of it), is 404; anything else is logged.
func (h *Handler) openFailed(w http.ResponseWriter, r *http.Request, name string, err error) {
	if !errors.Is(err, fs.ErrNotExist) {
		h.log.WarnContext(r.Context(), "Download refused", "file", name, logkey.Err, err)
	}
	writeError(w, http.StatusNotFound, apiv1.CodeNotFound, fmt.Sprintf("no %s here", path.Base(name)))
}

// writeError writes the API's error body.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code, msg})
}
