package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Release is an older release's binaries, built from its commit
// (BuildRelease).
type Release struct {
	Commit        string
	Version       string // what its binaries print and register
	BetterCompute string // path of its better-compute
	BCD           string // path of its bcd
}

// BuildRelease builds better-compute and bcd of commit (a full hash),
// stamped with version (-X main.version), in a git worktree it adds in the
// temporary folder (bc-e2e-release-COMMIT) and removes once built. The Go build and module
// caches are the test process's own, so only what differs from this tree
// compiles. A shallow clone (fetch the history with `git fetch
// --unshallow`) or a tree that is not a git clone skips the test, with that
// said; a full clone that lacks the commit fails it under CI=true.
func BuildRelease(t testing.TB, commit, version string) *Release {
	t.Helper()
	root := moduleRoot()
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
		b, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(b)), err
	}
	if out, err := git("cat-file", "-e", commit+"^{commit}"); err != nil {
		msg := fmt.Sprintf("release %s (commit %s) cannot be built: this tree's git clone lacks the commit (%v: %s); "+
			"a shallow clone needs `git fetch --unshallow` (or `git fetch origin %s`)", version, commit, err, out, commit)
		// A tree that is no git clone, or a shallow one (tests/run tries
		// `git fetch --unshallow` first), truly cannot hold the commit: a
		// skip, said loudly. A full clone without it is a broken pin: under
		// CI=true a failure.
		shallow, serr := git("rev-parse", "--is-shallow-repository")
		if os.Getenv("CI") == "true" && serr == nil && shallow == "false" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// The worktree's path is the same on every run: go's build cache keys
	// a package's compile on its folder (without -trimpath), so a fixed
	// path compiles the release once per machine, not once per run. A
	// worktree left by a run that was killed goes first.
	wt := filepath.Join(os.TempDir(), "bc-e2e-release-"+commit)
	if _, err := os.Stat(wt); err == nil {
		_, _ = git("worktree", "remove", "--force", wt)
		_ = os.RemoveAll(wt)
	}
	_, _ = git("worktree", "prune")
	if out, err := git("worktree", "add", "--detach", wt, commit); err != nil {
		t.Fatalf("git worktree add %s %s: %v\n%s", wt, commit, err, out)
	}
	defer func() {
		if out, err := git("worktree", "remove", "--force", wt); err != nil {
			t.Errorf("git worktree remove %s: %v\n%s", wt, err, out)
		}
	}()
	bin := t.TempDir()
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+version, "-o", bin+"/",
		"./controlplane/cmd/better-compute", "./bcd/cmd/bcd")
	cmd.Dir = wt
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build release %s (commit %s): %v\n%s", version, commit, err, b)
	}
	return &Release{Commit: commit, Version: version,
		BetterCompute: filepath.Join(bin, "better-compute"), BCD: filepath.Join(bin, "bcd")}
}
