package upgrade

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/installer/manifest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// release is a signed release of one bcd binary.
type release struct {
	version  string
	bin      []byte
	manifest []byte
	sig      []byte
}

// keyPair is a release key and its pin.
type keyPair struct {
	priv []byte
	pin  string
}

func newKey(t *testing.T) keyPair {
	t.Helper()
	_, priv, pin, err := manifest.GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{priv: priv, pin: pin}
}

// newRelease signs a manifest listing bin as bcd for this platform.
func newRelease(t *testing.T, k keyPair, version string, bin []byte, ttl time.Duration) *release {
	t.Helper()
	sum := sha256.Sum256(bin)
	now := time.Now().UTC().Truncate(time.Second)
	m := &manifest.Manifest{Version: version, CreatedAt: now.Add(-time.Hour), Artifacts: []manifest.Artifact{{
		Name: "bcd_" + runtime.GOOS + "_" + runtime.GOARCH + "/bcd", OS: runtime.GOOS, Arch: runtime.GOARCH,
		SHA256: hex.EncodeToString(sum[:]), Size: int64(len(bin)), Kind: manifest.KindBinary, Binary: "bcd"}}}
	exp := now.Add(ttl)
	m.ExpiresAt = &exp
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	sk, err := manifest.ParsePrivateKey(k.priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sig, err := manifest.Sign(b, sk, now)
	if err != nil {
		t.Fatal(err)
	}
	return &release{version: version, bin: bin, manifest: b, sig: sig}
}

func writeFileT(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
}

func readFileT(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSwapAndRestore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k := newKey(t)
	target := filepath.Join(dir, "bin", "bcd")
	writeFileT(t, target, []byte("old bcd"), 0o755)
	rel := newRelease(t, k, "0.2.0", []byte("new bcd"), time.Hour)
	staged := filepath.Join(dir, "staged")
	writeFileT(t, staged, rel.bin, 0o600)
	req := InstallRequest{Version: "0.2.0", Staged: staged, Manifest: rel.manifest, Signature: rel.sig}

	other := newKey(t)
	tampered := filepath.Join(dir, "tampered")
	writeFileT(t, tampered, []byte("new bcX"), 0o600)
	for name, p := range map[string]SwapParams{
		"unpinned key":  {InstallRequest: req, Target: target, Pins: []string{other.pin}},
		"no pins":       {InstallRequest: req, Target: target},
		"wrong version": {InstallRequest: InstallRequest{Version: "0.3.0", Staged: staged, Manifest: rel.manifest, Signature: rel.sig}, Target: target, Pins: []string{k.pin}},
		"tampered":      {InstallRequest: InstallRequest{Version: "0.2.0", Staged: tampered, Manifest: rel.manifest, Signature: rel.sig}, Target: target, Pins: []string{k.pin}},
		"expired":       {InstallRequest: req, Target: target, Pins: []string{k.pin}, Now: time.Now().Add(2 * time.Hour)},
		"other arch":    {InstallRequest: req, Target: target, Pins: []string{k.pin}, OS: "linux", Arch: "riscv64"},
	} {
		if _, err := Swap(p); err == nil {
			t.Errorf("%s: installed", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
		if got := readFileT(t, target); got != "old bcd" {
			t.Fatalf("%s changed the target: %q", name, got)
		}
	}
	if _, err := os.Stat(target + PrevSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused swap left %s: %v", target+PrevSuffix, err)
	}

	a, err := Swap(SwapParams{InstallRequest: req, Target: target, Pins: []string{other.pin, k.pin}})
	if err != nil {
		t.Fatal(err)
	}
	if a.Size != 7 || readFileT(t, target) != "new bcd" || readFileT(t, target+PrevSuffix) != "old bcd" {
		t.Fatalf("after swap: %q, prev %q", readFileT(t, target), readFileT(t, target+PrevSuffix))
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v", fi.Mode())
	}
	entries, _ := os.ReadDir(filepath.Dir(target))
	if len(entries) != 2 {
		t.Fatalf("left temporary files: %v", entries)
	}
	if err := Restore(target); err != nil {
		t.Fatal(err)
	}
	if readFileT(t, target) != "old bcd" || readFileT(t, target+PrevSuffix) != "old bcd" {
		t.Fatal("restore did not put the previous binary back")
	}
}

func TestReadPins(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k := newKey(t)
	p := filepath.Join(dir, "pins")
	if _, err := ReadPins(p); !errors.Is(err, ErrNoPins) {
		t.Fatalf("missing file: %v", err)
	}
	writeFileT(t, p, []byte("# release keys\n\n"+k.pin+"\n"), 0o644)
	if pins, err := ReadPins(p); err != nil || len(pins) != 1 || pins[0] != k.pin {
		t.Fatalf("pins %v %v", pins, err)
	}
	writeFileT(t, p, []byte("\n# none\n"), 0o644)
	if _, err := ReadPins(p); !errors.Is(err, ErrNoPins) {
		t.Fatalf("empty file: %v", err)
	}
	writeFileT(t, p, []byte(k.pin+"\nsha256/nope\n"), 0o644)
	if _, err := ReadPins(p); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("bad pin: %v", err)
	}
}

func TestFetchRetriesAndResumes(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("0123456789", 1000)
	sum := sha256.Sum256([]byte(body))
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		switch {
		case r.URL.Path == "/missing":
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"code":"NOT_FOUND","message":"no release 9.9.9"}`)
		case n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case n == 2:
			// Half the body, then the connection drops.
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusOK)
			fmt.Fprint(w, body[:len(body)/2])
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		default:
			if n == 3 && r.Header.Get("Range") != fmt.Sprintf("bytes=%d-", len(body)/2) {
				t.Errorf("third request without the range: %q", r.Header.Get("Range"))
			}
			http.ServeContent(w, r, "bcd", time.Time{}, strings.NewReader(body))
		}
	}))
	defer srv.Close()
	f := &fetcher{client: srv.Client(), attempts: 4, delay: time.Millisecond}
	dst := filepath.Join(t.TempDir(), "bcd")
	if err := f.download(context.Background(), srv.URL+"/bcd", dst, int64(len(body)), hex.EncodeToString(sum[:])); err != nil {
		t.Fatal(err)
	}
	if readFileT(t, dst) != body || calls.Load() != 3 {
		t.Fatalf("calls %d", calls.Load())
	}
	start := calls.Load()
	_, err := f.get(context.Background(), srv.URL+"/missing", 100)
	if err == nil || !strings.Contains(err.Error(), "no release 9.9.9") || calls.Load() != start+1 {
		t.Fatalf("404: %v after %d calls", err, calls.Load()-start)
	}
	err = f.download(context.Background(), srv.URL+"/bcd", dst, int64(len(body)), strings.Repeat("0", 64))
	if err == nil || !strings.Contains(err.Error(), "refusing to install it") {
		t.Fatalf("wrong digest: %v", err)
	}
}

// upgradeEnv is an Upgrader on a temporary installation with a downloads
// route serving releases.
type upgradeEnv struct {
	t        *testing.T
	dir      string
	target   string
	key      keyPair
	releases map[string]*release
	srv      *httptest.Server
	restarts atomic.Int32
	execs    chan []string
}

func newUpgradeEnv(t *testing.T) *upgradeEnv {
	t.Helper()
	e := &upgradeEnv{t: t, dir: t.TempDir(), key: newKey(t), releases: map[string]*release{}, execs: make(chan []string, 4)}
	e.target = filepath.Join(e.dir, "bin", "bcd")
	writeFileT(t, e.target, []byte("#!/bin/sh\nexit 0\n"), 0o755)
	writeFileT(t, filepath.Join(e.dir, "release-pins"), []byte(e.key.pin+"\n"), 0o644)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/downloads/bcd/"), "/")
		rel := e.releases[parts[0]]
		if len(parts) != 2 || rel == nil {
			http.Error(w, `{"code":"NOT_FOUND","message":"no such release"}`, http.StatusNotFound)
			return
		}
		switch parts[1] {
		case "manifest.json":
			w.Write(rel.manifest)
		case "manifest.json.minisig":
			w.Write(rel.sig)
		case runtime.GOOS + "-" + runtime.GOARCH:
			w.Write(rel.bin)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// script is a bcd stand-in: a shell script that reports a trial as
// version, or fails.
func script(version string, ok bool) []byte {
	if !ok {
		return []byte("#!/bin/sh\necho crashing >&2\nexit 1\n")
	}
	return []byte("#!/bin/sh\n[ -n \"$" + TrialEnv + "\" ] && echo \"ok " + version + "\" >&3\nexit 0\n")
}

func (e *upgradeEnv) upgrader(version string) *Upgrader {
	e.t.Helper()
	u, err := New(Config{Version: version, DataDir: filepath.Join(e.dir, "data"), Target: e.target,
		PinsFile: filepath.Join(e.dir, "release-pins"), BaseURL: e.srv.URL + "/api/downloads",
		HealthTimeout: 5 * time.Second, RetryDelay: time.Millisecond,
		Restart: func() { e.restarts.Add(1) },
		Args:    []string{"bcd", "node", "--data-dir", "x"}, Env: []string{"PATH=" + os.Getenv("PATH")},
		Exec: func(path string, args, env []string) error {
			e.execs <- append([]string{path}, args...)
			return errors.New("exec stub")
		},
		Logger: slog.New(slog.NewTextHandler(tWriter{e.t}, nil)),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func upgradeCmd(id, version string) *sessionv1.Command {
	return &sessionv1.Command{Id: id, Kind: "upgrade", Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{Version: version}}}
}

func TestUpgradeTrialAndRecord(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	e.releases["0.2.0"] = newRelease(t, e.key, "0.2.0", script("0.2.0", true), time.Hour)
	u := e.upgrader("0.1.0")
	if res := u.Upgrade(context.Background(), upgradeCmd("cmd_1", "0.2.0")); res != nil {
		t.Fatalf("upgrade returned %v, want a restart", res)
	}
	if e.restarts.Load() != 1 || readFileT(t, e.target) != string(script("0.2.0", true)) {
		t.Fatal("not installed and restarted")
	}
	if err := u.Handover(context.Background()); err == nil || !strings.Contains(err.Error(), "exec stub") {
		t.Fatalf("handover: %v", err)
	}
	if args := <-e.execs; args[0] != e.target || strings.Join(args[1:], " ") != e.target+" node --data-dir x" {
		t.Fatalf("exec %v", args)
	}

	// The restarted bcd: on probation, answers the redelivery from the
	// record, and the first Welcome ends the upgrade.
	u2 := e.upgrader("0.2.0")
	if probation, err := u2.Resume(context.Background()); err != nil || !probation {
		t.Fatalf("resume: %v %v", probation, err)
	}
	res := u2.Upgrade(context.Background(), upgradeCmd("cmd_1", "0.2.0"))
	var d Detail
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || json.Unmarshal(res.GetDetailJson(), &d) != nil ||
		d != (Detail{From: "0.1.0", To: "0.2.0"}) {
		t.Fatalf("redelivered result %v", res)
	}
	u2.Connected()
	if _, err := os.Stat(filepath.Join(e.dir, "data", "upgrade", "pending.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("marker left after Welcome: %v", err)
	}
	if readFileT(t, filepath.Join(e.dir, "data", "release", "manifest.json")) != string(e.releases["0.2.0"].manifest) {
		t.Fatal("release manifest not kept")
	}
	// The same version again succeeds at once.
	if res := u2.Upgrade(context.Background(), upgradeCmd("cmd_2", "0.2.0")); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("same version: %v", res)
	}
}

func TestUpgradeRollsBack(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	old := readFileT(t, e.target)
	e.releases["0.3.0"] = newRelease(t, e.key, "0.3.0", script("0.3.0", false), time.Hour)
	e.releases["0.4.0"] = newRelease(t, e.key, "0.4.0", script("9.9.9", true), time.Hour)
	for _, v := range []string{"0.3.0", "0.4.0"} {
		u := e.upgrader("0.1.0")
		if res := u.Upgrade(context.Background(), upgradeCmd("cmd_"+v, v)); res != nil {
			t.Fatalf("%s: %v", v, res)
		}
		if err := u.Handover(context.Background()); err == nil || !strings.Contains(err.Error(), "exec stub") {
			t.Fatalf("%s: handover: %v", v, err)
		}
		<-e.execs
		if readFileT(t, e.target) != old {
			t.Fatalf("%s: not rolled back", v)
		}
		u1 := e.upgrader("0.1.0")
		if probation, err := u1.Resume(context.Background()); probation || err != nil {
			t.Fatalf("%s: resume after rollback: %v %v", v, probation, err)
		}
		res := u1.Upgrade(context.Background(), upgradeCmd("cmd_"+v, v))
		if res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.GetError(), "rolled back to 0.1.0") {
			t.Fatalf("%s: result %v", v, res)
		}
		t.Logf("%s: %s", v, res.GetError())
		u1.Connected()
	}
}

func TestResumeRollsBackACrashedStart(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	old := readFileT(t, e.target)
	e.releases["0.2.0"] = newRelease(t, e.key, "0.2.0", script("0.2.0", true), time.Hour)
	u := e.upgrader("0.1.0")
	if res := u.Upgrade(context.Background(), upgradeCmd("cmd_1", "0.2.0")); res != nil {
		t.Fatal(res)
	}
	_ = u.Handover(context.Background())
	<-e.execs
	// The first start of 0.2.0 dies before its Welcome; the second rolls
	// back.
	if probation, err := e.upgrader("0.2.0").Resume(context.Background()); !probation || err != nil {
		t.Fatalf("first start: %v %v", probation, err)
	}
	if _, err := e.upgrader("0.2.0").Resume(context.Background()); err == nil || !strings.Contains(err.Error(), "exec stub") {
		t.Fatalf("second start: %v", err)
	}
	<-e.execs
	if readFileT(t, e.target) != old {
		t.Fatal("not rolled back")
	}
}

func TestUpgradeRefusals(t *testing.T) {
	t.Parallel()
	e := newUpgradeEnv(t)
	old := readFileT(t, e.target)
	other := newKey(t)
	e.releases["0.5.0"] = newRelease(t, other, "0.5.0", script("0.5.0", true), time.Hour)
	e.releases["0.6.0"] = newRelease(t, e.key, "0.6.0", script("0.6.0", true), -time.Minute)
	tampered := newRelease(t, e.key, "0.7.0", script("0.7.0", true), time.Hour)
	tampered.bin = append(tampered.bin, '#')
	e.releases["0.7.0"] = tampered
	u := e.upgrader("0.1.0")
	for v, want := range map[string]string{
		"0.5.0":  "not pinned",
		"0.6.0":  "expired",
		"0.7.0":  "refusing to install it",
		"0.8.0":  "no such release",
		"v0.2.0": "not a release version",
	} {
		res := u.Upgrade(context.Background(), upgradeCmd("cmd_"+v, v))
		if res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.GetError(), want) {
			t.Errorf("%s: %v, want an error about %q", v, res, want)
		}
	}
	if e.restarts.Load() != 0 || readFileT(t, e.target) != old {
		t.Fatal("a refused upgrade changed something")
	}
	if _, err := os.Stat(filepath.Join(e.dir, "data", "upgrade", "pending.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("marker left: %v", err)
	}
}
