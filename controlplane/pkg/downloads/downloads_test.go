package downloads

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const secret = "TOP-SECRET-OUTSIDE-THE-FOLDER"

func write(t *testing.T, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func targz(t *testing.T, p, name, body string) {
	t.Helper()
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "README.md", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1700000000, 0)})
	tw.Write([]byte(body))
	tw.Close()
	gz.Close()
	write(t, p, b.String())
}

// fixture makes a downloads folder: the folder itself is the 0.1.0 dist
// (metadata.json), 0.2.0/ is a mirror with archives only, and there are
// symbolic links pointing out of it.
func fixture(t *testing.T) (*Handler, string) {
	t.Helper()
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	write(t, filepath.Join(outside, "secret"), secret)
	write(t, filepath.Join(outside, "0.9.0", "bcd_linux_amd64_v1", "bcd"), secret)
	dir := filepath.Join(base, "dist")
	write(t, filepath.Join(dir, "metadata.json"), `{"project_name":"better-compute","version":"0.1.0"}`)
	write(t, filepath.Join(dir, "bcd_linux_amd64_v1", "bcd"), "bcd-0.1.0-amd64")
	write(t, filepath.Join(dir, "bcd_linux_amd64_v3", "bcd"), "bcd-0.1.0-amd64-v3")
	write(t, filepath.Join(dir, "bcd_linux_arm64_v8.0", "bcd"), "bcd-0.1.0-arm64")
	write(t, filepath.Join(dir, "manifest.json"), `{"version":"0.1.0"}`)
	write(t, filepath.Join(dir, "manifest.json.minisig"), "sig")
	targz(t, filepath.Join(dir, "0.2.0", "bcx-ipmi_0.2.0_linux_arm64.tar.gz"), "bcx-ipmi", "ipmi-0.2.0-arm64")
	write(t, filepath.Join(dir, "0.2.0", "metadata.json"), `{"version":"0.2.0"}`)
	// Links out of the folder: a version folder, a binary, a manifest.
	must(t, os.Symlink(filepath.Join(outside, "0.9.0"), filepath.Join(dir, "0.9.0")))
	must(t, os.MkdirAll(filepath.Join(dir, "0.3.0", "bcd_linux_amd64_v1"), 0o755))
	must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "0.3.0", "bcd_linux_amd64_v1", "bcd")))
	must(t, os.Symlink("../../outside/secret", filepath.Join(dir, "0.3.0", "manifest.json")))
	// A link that stays inside is fine.
	must(t, os.MkdirAll(filepath.Join(dir, "0.4.0", "bcd_linux_amd64_v1"), 0o755))
	must(t, os.Symlink("../../bcd_linux_amd64_v1/bcd", filepath.Join(dir, "0.4.0", "bcd_linux_amd64_v1", "bcd")))
	h, err := New(Config{Dir: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h, dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func do(h http.Handler, method, target string, hdr ...string) *httptest.ResponseRecorder {
	// Not httptest.NewRequest(method, target): the raw path must reach the
	// handler as a client could send it, dot segments and all.
	r := httptest.NewRequest(method, "/", nil)
	u, err := url.ParseRequestURI(target)
	if err != nil {
		panic(err)
	}
	r.URL = u
	r.RequestURI = target
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func digests(body string) (string, string) {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:]), base64.StdEncoding.EncodeToString(sum[:])
}

func TestServeBinary(t *testing.T) {
	t.Parallel()
	h, _ := fixture(t)
	for target, body := range map[string]string{
		"/api/downloads/bcd/0.1.0/linux-amd64":           "bcd-0.1.0-amd64", // v1 before v3
		"/api/downloads/bcd/0.1.0/linux-arm64":           "bcd-0.1.0-arm64",
		"/api/downloads/bcx-ipmi/0.2.0/linux-arm64":      "ipmi-0.2.0-arm64", // from the archive
		"/api/downloads/bcd/0.1.0/manifest.json":         `{"version":"0.1.0"}`,
		"/api/downloads/bcd/0.1.0/manifest.json.minisig": "sig",
		"/api/downloads/bcd/0.4.0/linux-amd64":           "bcd-0.1.0-amd64", // a link inside the folder
	} {
		w := do(h, "GET", target)
		if w.Code != 200 || w.Body.String() != body {
			t.Errorf("GET %s = %d %q, want %q", target, w.Code, w.Body, body)
			continue
		}
		hexSum, b64 := digests(body)
		if got := w.Header().Get("Repr-Digest"); got != "sha-256=:"+b64+":" {
			t.Errorf("%s: Repr-Digest %q", target, got)
		}
		if got := w.Header().Get("Digest"); got != "SHA-256="+b64 {
			t.Errorf("%s: Digest %q", target, got)
		}
		if got := w.Header().Get("ETag"); got != `"sha256-`+hexSum+`"` {
			t.Errorf("%s: ETag %q", target, got)
		}
		if got := w.Header().Get("Content-Length"); got != itoa(len(body)) {
			t.Errorf("%s: Content-Length %q", target, got)
		}
	}
	w := do(h, "HEAD", "/api/downloads/bcd/0.1.0/linux-amd64")
	if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get("Content-Length") != "15" {
		t.Errorf("HEAD = %d %q %v", w.Code, w.Body, w.Header())
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestRangeAndETag(t *testing.T) {
	t.Parallel()
	h, _ := fixture(t)
	for _, target := range []string{"/api/downloads/bcd/0.1.0/linux-amd64", "/api/downloads/bcx-ipmi/0.2.0/linux-arm64"} {
		full := do(h, "GET", target)
		body := full.Body.String()
		w := do(h, "GET", target, "Range", "bytes=4-")
		if w.Code != http.StatusPartialContent || w.Body.String() != body[4:] {
			t.Errorf("%s range = %d %q", target, w.Code, w.Body)
		}
		if cr := w.Header().Get("Content-Range"); cr != "bytes 4-"+itoa(len(body)-1)+"/"+itoa(len(body)) {
			t.Errorf("%s Content-Range %q", target, cr)
		}
		// The representation digest is the whole file's, on a range too.
		if w.Header().Get("Repr-Digest") != full.Header().Get("Repr-Digest") {
			t.Errorf("%s: Repr-Digest differs on a range", target)
		}
		etag := full.Header().Get("ETag")
		if w := do(h, "GET", target, "If-None-Match", etag); w.Code != http.StatusNotModified || w.Body.Len() != 0 {
			t.Errorf("%s If-None-Match = %d", target, w.Code)
		}
		if w := do(h, "GET", target, "If-None-Match", `"sha256-other"`); w.Code != 200 {
			t.Errorf("%s other If-None-Match = %d", target, w.Code)
		}
		// A resumed download whose file changed gets the whole file.
		if w := do(h, "GET", target, "Range", "bytes=4-", "If-Range", `"sha256-other"`); w.Code != 200 || w.Body.String() != body {
			t.Errorf("%s stale If-Range = %d", target, w.Code)
		}
		if w := do(h, "GET", target, "Range", "bytes=4-", "If-Range", etag); w.Code != http.StatusPartialContent {
			t.Errorf("%s If-Range = %d", target, w.Code)
		}
		if w := do(h, "GET", target, "Range", "bytes=999-"); w.Code != http.StatusRequestedRangeNotSatisfiable {
			t.Errorf("%s unsatisfiable range = %d", target, w.Code)
		}
	}
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	h, _ := fixture(t)
	for _, target := range []string{
		"/api/downloads/nope/0.1.0/linux-amd64",
		"/api/downloads/bcd/9.9.9/linux-amd64",
		"/api/downloads/bcd/latest/linux-amd64",
		"/api/downloads/bcd/0.1.0/plan9-mips",
		"/api/downloads/bcd/0.1.0/linux-riscv64",
		"/api/downloads/bcd/0.1.0/metadata.json",
		"/api/downloads/bcd/0.1.0/linux_amd64",
		"/api/downloads/bcd/0.1.0",
		"/api/downloads/bcd/0.1.0/linux-amd64/extra",
		"/api/downloads/bcx-ipmi/0.1.0/linux-amd64",
		"/api/downloads/bcd/0.2.0/manifest.json",
	} {
		w := do(h, "GET", target)
		var body struct{ Code, Message string }
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != 404 || body.Code != "NOT_FOUND" || body.Message == "" {
			t.Errorf("GET %s = %d %s", target, w.Code, w.Body)
		}
	}
	if w := do(h, "POST", "/api/downloads/bcd/0.1.0/linux-amd64"); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST = %d", w.Code)
	}
}

// TestNoEscape: nothing outside the folder is ever served, whatever the
// path: dot segments, encoded dots and slashes, symbolic links out.
func TestNoEscape(t *testing.T) {
	t.Parallel()
	h, _ := fixture(t)
	mux := http.NewServeMux() // mounted as the api mounts it
	mux.Handle("/api/downloads/", h)
	targets := []string{
		"/api/downloads/bcd/../../../outside/secret",
		"/api/downloads/bcd/0.1.0/../../../../outside/secret",
		"/api/downloads/../../outside/secret",
		"/api/downloads/bcd/%2e%2e/%2e%2e/%2e%2e/outside/secret",
		"/api/downloads/bcd/%2E%2E%2F%2E%2E%2Foutside%2Fsecret/linux-amd64",
		"/api/downloads/bcd/0.1.0%2f..%2f..%2foutside/linux-amd64",
		"/api/downloads/bcd/..%2f..%2foutside/secret",
		"/api/downloads/bcd/0.1.0/..%5c..%5csecret",
		"/api/downloads/bcd/0.1.0/%00",
		"/api/downloads/bcd//0.1.0/linux-amd64",
		"/api/downloads/bcd/./0.1.0/linux-amd64",
		"/api/downloads/bcd/0.9.0/linux-amd64",   // version folder links out
		"/api/downloads/bcd/0.3.0/linux-amd64",   // binary links out
		"/api/downloads/bcd/0.3.0/manifest.json", // manifest links out
	}
	for _, target := range targets {
		for name, hh := range map[string]http.Handler{"handler": h, "mux": mux} {
			w := do(hh, "GET", target)
			if w.Code == 200 || strings.Contains(w.Body.String(), secret) {
				t.Errorf("%s GET %s = %d %q: escaped the folder", name, target, w.Code, w.Body)
			}
			if name == "handler" && w.Code != 400 && w.Code != 404 {
				t.Errorf("handler GET %s = %d, want 400 or 404", target, w.Code)
			}
		}
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}); err == nil {
		t.Error("no folder accepted")
	}
	if _, err := New(Config{Dir: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("missing folder accepted")
	}
}
