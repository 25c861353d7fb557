package cmduser_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/process"
)

func TestCheckRefusesRootAndBCD(t *testing.T) {
	for _, tc := range []struct {
		u    cmduser.User
		bcd  uint32
		want string
	}{
		{cmduser.User{Name: "root", UID: 0, GID: 0}, 999, "is root"},
		{cmduser.User{Name: "wheel", UID: 5, GID: 0}, 999, "is root"},
		{cmduser.User{Name: "bcd", UID: 999, GID: 999}, 999, "the uid bcd runs as"},
	} {
		if err := tc.u.Check(tc.bcd); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v beside bcd uid %d: %v, want %q", tc.u, tc.bcd, err, tc.want)
		}
	}
	if err := (cmduser.User{Name: "bcd-cmd", UID: 998, GID: 998}).Check(0); err != nil {
		t.Errorf("a distinct user refused: %v", err)
	}
}

// TestRunnerRunsAsTheUser: a program runs as the user, in its HOME (made
// 0700 and its own), with USER and HOME set; a symbolic link in HOME's place
// is refused, not followed.
func TestRunnerRunsAsTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true but not root")
		}
		t.Skip("not root: switching users needs root")
	}
	u, err := cmduser.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.MkdirTemp("", "bc-cmduser-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	if err := cmduser.OpenDataDir(data); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(data); fi.Mode().Perm() != 0o711 {
		t.Fatalf("data dir mode %v, want 0711", fi.Mode().Perm())
	}
	home := cmduser.Home(data)
	if err := cmduser.Reachable(home, u); err != nil {
		t.Fatal(err)
	}
	r := &cmduser.Runner{User: u, Home: home}
	var out bytes.Buffer
	res := r.Exec(context.Background(), process.Spec{Argv: []string{"sh", "-c", "echo $(id -u):$(id -g):$(id -G) $USER $HOME $(pwd)"}},
		func(_ int, b []byte) { out.Write(b) })
	want := strings.Join([]string{"65534:" + itoa(u.GID) + ":" + itoa(u.GID), "nobody", home, home}, " ")
	if res.ExitCode != 0 || strings.TrimSpace(out.String()) != want {
		t.Fatalf("ran %+v, printed %q, want %q", res, out.String(), want)
	}
	if fi, err := os.Stat(home); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("home: %v %v", fi, err)
	}

	link := filepath.Join(data, "link")
	if err := os.Symlink("/etc", link); err != nil {
		t.Fatal(err)
	}
	if err := cmduser.MakeHome(link, u); err == nil {
		t.Fatal("MakeHome followed a symbolic link")
	}
	if fi, _ := os.Stat("/etc"); fi.Sys() != nil && statUID(fi) != 0 {
		t.Fatal("/etc changed owner")
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

func statUID(fi os.FileInfo) uint32 { return fi.Sys().(*syscall.Stat_t).Uid }
