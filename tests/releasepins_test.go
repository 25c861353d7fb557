package tests

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	"github.com/better-compute/better-compute/bcd/upgrade"
	"github.com/better-compute/better-compute/installer/manifest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestReleasePinsSign (issue 35, item 2, the signing step): with the real
// binary, a statement adding a new key's pin signed by the old key applies
// to a pin file that pins the old key, and is refused by one that pins
// neither; the new key cannot sign its own addition.
func TestReleasePinsSign(t *testing.T) {
	t.Parallel()
	bc := testenv.Binary(t, "better-compute")
	dir := t.TempDir()
	keygen := func(name string) string {
		t.Helper()
		code, out, stderr := testenv.Run(t, nil, "", bc, "release", "keygen", "--out", filepath.Join(dir, name))
		m := regexp.MustCompile(`pin:\s+(sha256/\S+)`).FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("release keygen: exit %d\n%s%s", code, out, stderr)
		}
		return m[1]
	}
	oldPin, newPin, otherPin := keygen("old.key"), keygen("new.key"), keygen("other.key")
	stmt := filepath.Join(dir, "add-new.json")

	// The new key vouching for itself: a usage error, nothing written.
	code, out, stderr := testenv.Run(t, nil, "", bc, "release", "pins", "sign", "--key", filepath.Join(dir, "new.key"), "--add", newPin, "--out", stmt)
	if code != exitUsage || !strings.Contains(stderr, "cannot vouch for itself") {
		t.Fatalf("self-signed addition: exit %d\n%s%s", code, out, stderr)
	}
	if _, err := os.Stat(stmt); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused statement was written: %v", err)
	}

	code, out, stderr = testenv.Run(t, nil, "", bc, "release", "pins", "sign", "--key", filepath.Join(dir, "old.key"), "--add", newPin, "--out", stmt)
	if code != 0 || !strings.Contains(out, "add "+newPin+", signed by "+oldPin) {
		t.Fatalf("release pins sign: exit %d\n%s%s", code, out, stderr)
	}
	doc, err := os.ReadFile(stmt)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := os.ReadFile(stmt + ".minisig")
	if err != nil {
		t.Fatal(err)
	}

	// A machine that pins only another key refuses it, unchanged.
	otherFile := filepath.Join(dir, "pins-other")
	if err := os.WriteFile(otherFile, []byte(otherPin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := upgrade.ApplyPinStatement(otherFile, doc, sig); !errors.Is(err, manifest.ErrUnpinnedKey) {
		t.Errorf("applied where the signer is not pinned: %v", err)
	}
	if pins, _ := upgrade.ReadPins(otherFile); len(pins) != 1 {
		t.Errorf("pins after the refusal: %v", pins)
	}
	// A machine that pins the old key gets the new one.
	oldFile := filepath.Join(dir, "pins-old")
	if err := os.WriteFile(oldFile, []byte(oldPin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := upgrade.ApplyPinStatement(oldFile, doc, sig); err != nil || !c.Changed {
		t.Fatalf("apply: %+v, %v", c, err)
	}
	if pins, err := upgrade.ReadPins(oldFile); err != nil || len(pins) != 2 || pins[1] != newPin {
		t.Errorf("pins after the statement: %v, %v; want %s and %s", pins, err, oldPin, newPin)
	}
}

// newPinnedInstallEnv is newInstallEnv whose control plane pins the
// release key from the start (downloads.releasePins), as a deployment
// that verifies pin statements does.
func newPinnedInstallEnv(t *testing.T) *installEnv {
	t.Helper()
	dir := t.TempDir()
	e := &installEnv{t: t, dir: dir, bc: testenv.Binary(t, "better-compute"),
		dist: filepath.Join(dir, "dist"), keys: filepath.Join(dir, "keys")}
	if err := os.MkdirAll(e.dist, 0o755); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := testenv.Run(t, nil, "", e.bc, "release", "keygen", "--out", filepath.Join(e.keys, "release.key"))
	m := regexp.MustCompile(`pin:\s+(sha256/\S+)`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("release keygen: exit %d\n%s%s", code, out, stderr)
	}
	e.pin = m[1]
	port := freePort(t)
	e.gatewayURL = fmt.Sprintf("https://localhost:%d", port)
	e.cfg = testenv.WriteFile(t, "better-compute.yaml", fmt.Sprintf(
		"host:\n  listen: 127.0.0.1:0\n  gateway:\n    listen: 127.0.0.1:%d\ndownloads:\n  releasePins: [%s]\n", port, e.pin))
	e.env = []string{"BETTER_COMPUTE_DATA_DIR=" + filepath.Join(dir, "data"), "BETTER_COMPUTE_DOWNLOADS_DIR=" + e.dist}
	p := testenv.Start(t, e.env, e.bc, "serve", "--config", e.cfg)
	e.api = "http://" + p.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	p.WaitLine(`msg="Gateway listening"`, 30*time.Second)
	e.env = append(e.env, "BETTER_COMPUTE_URL="+e.api)
	e.cli("sites", "create", "--name", "site-e2e", "--region", "default")
	e.cli("pools", "create", "--name", "pool-e2e", "--site", "site-e2e")
	return e
}

// TestReleasePins (issue 35 item 2, Done-when): two real bcd installed by
// the install script pin the deployment's old release key. A statement
// signed by an unpinned key is refused; `release pins add` of one signed
// by the old key reaches the live node at once and the node that was
// offline when it reconnects (status counts both); then a release signed
// only by the new key upgrades both. Removing the old pin is accepted
// once every live node holds the new one; removing the current release's
// signer is refused.
func TestReleasePins(t *testing.T) {
	t.Parallel()
	e := newPinnedInstallEnv(t)
	e.release("0.1.0", bcdAt(t, "0.1.0"))
	oldPin := e.pin
	oldKey := filepath.Join(e.keys, "release.key")
	keygen := func(name string) (string, string) {
		t.Helper()
		key := filepath.Join(e.dir, "keys-"+name, "release.key")
		out := e.cli("release", "keygen", "--out", key)
		return key, regexp.MustCompile(`pin:\s+(sha256/\S+)`).FindStringSubmatch(out)[1]
	}
	newKey, newPin := keygen("new")
	otherKey, _ := keygen("other")
	token := e.token(2)

	// Two machines, each installed and joined by the install script.
	type machine struct {
		root string
		pins string
		args []string
		p    *testenv.Proc
	}
	var ms []*machine
	for range 2 {
		h := newHost(t)
		if code, stdout, stderr := h.run("dash", e.script("0.1.0"), nil, "--token-file", token); code != 0 {
			t.Fatalf("install: exit %d\n%s%s", code, stdout, stderr)
		}
		m := &machine{root: h.root, pins: filepath.Join(h.root, "etc/bcd/release-pins")}
		m.args = []string{"node", "--data-dir", filepath.Join(h.root, "var/lib/bcd"), "--release-pins-file", m.pins,
			"--upgrade-health-timeout", "30s"}
		m.p = testenv.Start(t, nil, filepath.Join(h.root, "usr/local/bin/bcd"), m.args...)
		m.p.WaitLine(`msg="Session established"`, 60*time.Second)
		ms = append(ms, m)
	}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		return testenv.Run(t, e.env, "", e.bc, append([]string{"--config", e.cfg}, args...)...)
	}
	// held waits until release pins status PIN says "held want".
	held := func(pin, want string) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			last = e.cli("release", "pins", "status", pin)
			if strings.HasPrefix(last, "held "+want+"\n") {
				return
			}
		}
		t.Fatalf("release pins status %s never said held %s; last:\n%s", pin, want, last)
	}
	holds := func(m *machine, pin string) bool {
		pins, err := upgrade.ReadPins(m.pins)
		return err == nil && slices.Contains(pins, pin)
	}
	held(oldPin, "2/2")

	// The second machine goes offline.
	ms[1].p.Stop(syscall.SIGTERM, 10*time.Second)
	held(oldPin, "1/1")

	// A statement signed by a key the deployment does not pin: refused,
	// a usage error (INVALID_ARGUMENT), nothing sent.
	bad := filepath.Join(e.dir, "bad.json")
	e.cli("release", "pins", "sign", "--key", otherKey, "--add", newPin, "--out", bad)
	if code, out, stderr := run("release", "pins", "add", bad); code != exitUsage || !strings.Contains(stderr, "does not pin") {
		t.Fatalf("a statement by an unpinned key: exit %d\n%s%s", code, out, stderr)
	}
	if out := e.cli("release", "pins", "status", newPin); !strings.Contains(out, "statements  0") {
		t.Fatalf("the refused statement was kept:\n%s", out)
	}

	// The old key vouches for the new one: the live machine holds it.
	add := filepath.Join(e.dir, "add-new.json")
	e.cli("release", "pins", "sign", "--key", oldKey, "--add", newPin, "--out", add)
	if out := e.cli("release", "pins", "add", add); !strings.Contains(out, "in force    "+oldPin+", "+newPin) {
		t.Errorf("release pins add:\n%s", out)
	}
	held(newPin, "1/1")
	if !holds(ms[0], newPin) || holds(ms[1], newPin) {
		t.Fatalf("after pins add: the live machine holds the new pin %v, the offline one %v", holds(ms[0], newPin), holds(ms[1], newPin))
	}

	// The offline machine reconnects and gets it.
	ms[1].p = testenv.Start(t, nil, filepath.Join(ms[1].root, "usr/local/bin/bcd"), ms[1].args...)
	ms[1].p.WaitLine(`msg="Session established"`, 60*time.Second)
	held(newPin, "2/2")
	if !holds(ms[1], newPin) {
		t.Fatal("the machine that was offline does not hold the new pin")
	}

	// A release signed only by the new key upgrades both.
	e.release("0.2.0", bcdAt(t, "0.2.0"))
	e.cli("release", "sign", "--key", newKey, "--in", filepath.Join(e.dist, "0.2.0", "manifest.json"))
	var list struct{ Nodes []nodeJSON }
	if err := json.Unmarshal([]byte(e.cli("nodes", "list", "-o", "json")), &list); err != nil || len(list.Nodes) != 2 {
		t.Fatalf("nodes list: %v %+v", err, list)
	}
	for _, n := range list.Nodes {
		code, out, stderr := run("nodes", "upgrade", "--node", n.ID, "--version", "0.2.0", "--timeout", "3m")
		if code != 0 || !strings.Contains(out, "succeeded") {
			t.Fatalf("upgrade %s to 0.2.0 (signed by the new key only): exit %d\n%s%s", n.ID, code, out, stderr)
		}
		var got nodeJSON
		if err := json.Unmarshal([]byte(e.cli("nodes", "get", n.ID, "-o", "json")), &got); err != nil || got.BcdVersion != "0.2.0" {
			t.Errorf("after the upgrade: %+v %v", got, err)
		}
	}

	// The current release (0.2.0) is the new key's: removing its pin is
	// refused; removing the old one is accepted and reaches both.
	rmNew := filepath.Join(e.dir, "remove-new.json")
	e.cli("release", "pins", "sign", "--key", oldKey, "--remove", newPin, "--out", rmNew)
	if code, out, stderr := run("release", "pins", "remove", rmNew); code != exitFailure || !strings.Contains(stderr, "signed by the key of "+newPin) {
		t.Errorf("removing the current release's signer: exit %d\n%s%s", code, out, stderr)
	}
	held(newPin, "2/2")
	rmOld := filepath.Join(e.dir, "remove-old.json")
	e.cli("release", "pins", "sign", "--key", newKey, "--remove", oldPin, "--out", rmOld)
	e.cli("release", "pins", "remove", rmOld)
	held(oldPin, "0/2")
	for i, m := range ms {
		if holds(m, oldPin) || !holds(m, newPin) {
			t.Errorf("machine %d after removing the old pin: old %v, new %v", i, holds(m, oldPin), holds(m, newPin))
		}
		// Statements resent on every session and already in effect (the
		// addition signed by the key removed since) are skipped quietly.
		if strings.Contains(m.p.Output(), "Release pin statement not applied") {
			t.Errorf("machine %d warned about a statement:\n%s", i, m.p.Output())
		}
	}
}

// TestReleasePinsUnprivileged: an unprivileged bcd (run as a fresh system
// user beside a real root `bcd helper`) offers release.pins, applies the
// statements its gateway sends through the helper to a root-owned pin file
// it cannot write, skips one signed by a key the file does not pin, and
// reports the pins it holds.
func TestReleasePinsUnprivileged(t *testing.T) {
	t.Parallel()
	u := newNodeUser(t)
	bcd := testenv.Binary(t, "bcd")
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: time.Second})
	tok := p.NewToken(t)
	g.AddToken(tok)
	base := openDir(t)
	data := filepath.Join(base, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, int(u.uid), int(u.gid)); err != nil {
		t.Fatal(err)
	}
	key := func() (minisign.PrivateKey, string) {
		_, priv, pin, err := manifest.GenerateKey("")
		if err != nil {
			t.Fatal(err)
		}
		sk, err := manifest.ParsePrivateKey(priv, "")
		if err != nil {
			t.Fatal(err)
		}
		return sk, pin
	}
	oldKey, oldPin := key()
	_, newPin := key()
	otherKey, _ := key()
	_, thirdPin := key()
	pins := filepath.Join(base, "release-pins") // root's, 0644: the node user reads it, cannot write it
	if err := os.WriteFile(pins, []byte(oldPin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(base, "run", "helper.sock")
	if code, out, errOut := testenv.RunAs(t, u.cred(), []string{"BCD_JOIN_TOKEN=" + tok}, "", bcd,
		"join", "--gateway", g.URL, "--data-dir", data); code != 0 {
		t.Fatalf("bcd join as %s: exit %d: %s %s", u.name, code, out, errOut)
	}
	cu := newNodeUser(t)
	hp := testenv.Start(t, nil, bcd, "helper", "--node-user", u.name, "--command-user", cu.name, "--data-dir", data, "--socket", sock,
		"--release-pins-file", pins)
	hp.WaitLine(`Root helper listening`, 30*time.Second)
	node := testenv.StartAs(t, u.cred(), nil, bcd, "node", "--unprivileged", "--helper-socket", sock, "--data-dir", data,
		"--release-pins-file", pins)
	s := g.NextSession(t, 30*time.Second)
	if !slices.Contains(s.Hello.GetCapabilities(), sessionv1.CapabilityReleasePins) {
		t.Fatalf("Hello capabilities %v lack release.pins\n%s", s.Hello.GetCapabilities(), node.Output())
	}
	sign := func(sk minisign.PrivateKey, pin string) *sessionv1.ReleasePinStatement {
		doc, sig, err := manifest.SignPinStatement(manifest.PinAdd, pin, sk, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return &sessionv1.ReleasePinStatement{Statement: doc, Signature: sig}
	}
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_ReleasePins{ReleasePins: &sessionv1.ReleasePins{
		Statements: []*sessionv1.ReleasePinStatement{sign(otherKey, thirdPin), sign(oldKey, newPin)}}}}); err != nil {
		t.Fatal(err)
	}
	m := awaitMessage(t, s, "ReleasePinsHeld", func(m *sessionv1.NodeMessage) bool { return m.GetReleasePinsHeld() != nil })
	if got := m.GetReleasePinsHeld().GetPins(); !slices.Equal(got, []string{oldPin, newPin}) {
		t.Fatalf("ReleasePinsHeld = %v, want %s and %s\n%s\n%s", got, oldPin, newPin, node.Output(), hp.Output())
	}
	if held, err := upgrade.ReadPins(pins); err != nil || !slices.Equal(held, []string{oldPin, newPin}) {
		t.Errorf("pin file = %v, %v", held, err)
	}
	fi, err := os.Stat(pins)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || fi.Mode().Perm() != 0o644 {
		t.Errorf("pin file after the statement: mode %v, uid %d; want 0644, root's", fi.Mode().Perm(), st.Uid)
	}
	if !strings.Contains(node.Output(), "Release pin statement not applied") {
		t.Errorf("the statement by an unpinned key was not refused:\n%s", node.Output())
	}
}
