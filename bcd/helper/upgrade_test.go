package helper_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/upgrade"
	"github.com/better-compute/better-compute/installer/manifest"
)

// signedRelease returns a manifest listing bin as this platform's bcd and
// its signature by a new key, and that key's pin.
func signedRelease(t *testing.T, version string, bin []byte) (mf, sig []byte, pin string) {
	t.Helper()
	_, priv, pin, err := manifest.GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bin)
	m := &manifest.Manifest{Version: version, CreatedAt: time.Now().UTC().Truncate(time.Second), Artifacts: []manifest.Artifact{{
		Name: "bcd_" + runtime.GOOS + "_" + runtime.GOARCH + "/bcd", OS: runtime.GOOS, Arch: runtime.GOARCH,
		SHA256: hex.EncodeToString(sum[:]), Size: int64(len(bin)), Kind: manifest.KindBinary, Binary: "bcd"}}}
	mf, err = m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	sk, err := manifest.ParsePrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sig, err = manifest.Sign(mf, sk, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return mf, sig, pin
}

func TestUpgradeThroughHelper(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "bin", "bcd")
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte("bcd 0.1.0"), 0o755); err != nil {
		t.Fatal(err)
	}
	mf, sig, pin := signedRelease(t, "0.2.0", []byte("bcd 0.2.0"))
	pins := filepath.Join(dir, "release-pins")
	if err := os.WriteFile(pins, []byte(pin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(dir, "staged")
	if err := os.WriteFile(staged, []byte("bcd 0.2.0"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "helper.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := helper.NewServer(helper.Config{Socket: sock, NodeUID: uint32(os.Getuid()), NodeGID: uint32(os.Getgid()),
		Binary: target, PinsFile: pins}, slog.New(slog.DiscardHandler))
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	c := &helper.Client{Socket: sock}
	for deadline := time.Now().Add(5 * time.Second); c.Ping(ctx) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("helper never answered")
		}
	}
	var _ upgrade.Installer = c

	// The helper verifies against its own pins: a manifest signed by
	// another key is refused and nothing changes.
	otherMF, otherSig, _ := signedRelease(t, "0.2.0", []byte("bcd 0.2.0"))
	err := c.Install(ctx, &upgrade.InstallRequest{Version: "0.2.0", Staged: staged, Manifest: otherMF, Signature: otherSig})
	if err == nil || !strings.Contains(err.Error(), "not pinned") {
		t.Fatalf("unpinned: %v", err)
	}
	// A staged file that is a symbolic link is not followed.
	link := filepath.Join(dir, "link")
	if err := os.Symlink(staged, link); err != nil {
		t.Fatal(err)
	}
	if err := c.Install(ctx, &upgrade.InstallRequest{Version: "0.2.0", Staged: link, Manifest: mf, Signature: sig}); err == nil {
		t.Fatal("installed through a symbolic link")
	}
	if b, _ := os.ReadFile(target); string(b) != "bcd 0.1.0" {
		t.Fatalf("a refused install changed the binary: %q", b)
	}

	if err := c.Install(ctx, &upgrade.InstallRequest{Version: "0.2.0", Staged: staged, Manifest: mf, Signature: sig}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "bcd 0.2.0" {
		t.Fatalf("after install: %q", b)
	}
	if b, _ := os.ReadFile(target + upgrade.PrevSuffix); string(b) != "bcd 0.1.0" {
		t.Fatalf("previous: %q", b)
	}
	if err := c.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "bcd 0.1.0" {
		t.Fatalf("after rollback: %q", b)
	}
	if err := os.Remove(target + upgrade.PrevSuffix); err != nil {
		t.Fatal(err)
	}
	if err := c.Rollback(ctx); err == nil || errors.Is(err, helper.ErrUnavailable) {
		t.Fatalf("rollback without a previous binary: %v", err)
	}
}

// TestPinsThroughHelper: the helper applies a pin statement signed by a key
// its own pin file names, and refuses one signed by another key, leaving
// the file as it was.
func TestPinsThroughHelper(t *testing.T) {
	dir := t.TempDir()
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
	strangerKey, newPin := key()
	pins := filepath.Join(dir, "release-pins")
	if err := os.WriteFile(pins, []byte(oldPin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "helper.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := helper.NewServer(helper.Config{Socket: sock, NodeUID: uint32(os.Getuid()), NodeGID: uint32(os.Getgid()), PinsFile: pins},
		slog.New(slog.DiscardHandler))
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	c := &helper.Client{Socket: sock}
	for deadline := time.Now().Add(5 * time.Second); c.Ping(ctx) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("helper never answered")
		}
	}

	doc, sig, err := manifest.SignPinStatement(manifest.PinAdd, newPin, strangerKey, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyPinStatement(ctx, doc, sig); err == nil || !strings.Contains(err.Error(), "not pinned") {
		t.Fatalf("statement by an unpinned key: %v", err)
	}
	if got, _ := upgrade.ReadPins(pins); len(got) != 1 || got[0] != oldPin {
		t.Fatalf("a refused statement changed the pins: %v", got)
	}
	doc, sig, err = manifest.SignPinStatement(manifest.PinAdd, newPin, oldKey, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pc, err := c.ApplyPinStatement(ctx, doc, sig)
	if err != nil || !pc.Changed || pc.Statement.Pin != newPin {
		t.Fatalf("statement by the pinned key: %+v, %v", pc, err)
	}
	if got, _ := upgrade.ReadPins(pins); len(got) != 2 || got[1] != newPin {
		t.Fatalf("pins after the statement: %v", got)
	}
}
