package tests

import (
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/tests/testenv"
)

// sharedDir returns a fresh folder every user may write (the command user
// bcd-cmd writes there), removed when the test ends.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := openDir(t)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCommandsRunAsCommandUser: on a bcd running as root (the default
// install), an operator's `commands run -- id -u` and `nodes shell` run as
// the command user bcd-cmd, which bcd creates when it is missing: neither
// root nor bcd's own uid (issue 27). The command gets its own HOME in the
// data dir as its working directory, an environment of PATH, HOME, USER and
// LANG only, and cannot read the node's key or /etc/shadow.
func TestCommandsRunAsCommandUser(t *testing.T) {
	t.Parallel()
	needRoot(t, "bcd in root mode switches to the command user")
	d := newDeployment(t, backendSQLite)
	file, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "cmduser-root")
	nodeID := m.mustJoin(d.gatewayURL, file)
	bcd := m.node()
	got := bcd.WaitLine(`msg="Commands run as the command user" .*command_user=(\S+) uid=(\d+)`, 30*time.Second)
	bcd.WaitLine(sessionEstablished.String(), 30*time.Second)
	if got[1] != cmduser.DefaultName {
		t.Fatalf("command user %s, want %s", got[1], cmduser.DefaultName)
	}
	u, err := user.Lookup(cmduser.DefaultName)
	if err != nil || u.Uid != got[2] {
		t.Fatalf("user %s: %v, %v; bcd said uid %s", cmduser.DefaultName, u, err, got[2])
	}
	bcdUID := strconv.Itoa(os.Geteuid()) // bcd runs as root, as this test
	operator := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "operator")...))
	run := func(argv ...string) (int, string) {
		t.Helper()
		code, stdout, stderr := testenv.Run(t, nil, "", d.bc, append([]string{"commands", "run", "--server", d.api, "--token", operator,
			"--node", nodeID, "--"}, argv...)...)
		// Each line of output is "NODE: line".
		return code, strings.ReplaceAll("\n"+stdout+stderr, "\n"+nodeID+": ", "\n")[1:]
	}

	code, out := run("id", "-u")
	uid := strings.TrimSpace(out)
	t.Logf("commands run -- id -u printed %q (bcd's uid %s)", uid, bcdUID)
	if code != 0 || uid == "0" || uid == bcdUID || uid != u.Uid {
		t.Fatalf("commands run -- id -u: exit %d, printed %q; want %s's uid %s, neither 0 nor bcd's %s", code, out, u.Username, u.Uid, bcdUID)
	}
	home := filepath.Join(m.dataDir, cmduser.HomeDir)
	if code, out := run("env"); code != 0 || !sameLines(out, "HOME="+home, "LANG=C.UTF-8", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "USER="+cmduser.DefaultName) {
		t.Errorf("env of a command: exit %d\n%s", code, out)
	}
	if code, out := run("pwd"); code != 0 || strings.TrimSpace(out) != home {
		t.Errorf("pwd of a command: exit %d %q, want %s", code, out, home)
	}
	if fi, err := os.Stat(home); err != nil || fi.Mode().Perm() != 0o700 || strconv.Itoa(int(statUID(fi))) != u.Uid {
		t.Errorf("command home %s: %v %v", home, fi, err)
	}
	for _, f := range []string{"/etc/shadow", filepath.Join(m.dataDir, "node.key")} {
		if code, out := run("cat", f); code == 0 || !strings.Contains(out, "Permission denied") {
			t.Errorf("cat %s as a command: exit %d, %q; want permission denied", f, code, out)
		}
	}

	// A plain nodes shell is the command user's too.
	sh := startShell(t, &tunnelTarget{bc: d.bc, env: []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + operator}, nodeID: nodeID, bcd: bcd}, 24, 80)
	sh.send(t, "echo uid=$(id -u) pwd=$(pwd)\r")
	sh.expect(t, regexp.MustCompile(`uid=`+u.Uid+` pwd=`+regexp.QuoteMeta(home)+`\r`))
	sh.send(t, "exit\r")
	if code := sh.exit(t, 15*time.Second); code != 0 {
		t.Fatalf("nodes shell exited %d\n%s", code, sh.output())
	}
}

// sameLines reports whether out holds exactly the lines want, in order.
func sameLines(out string, want ...string) bool {
	return strings.Join(want, "\n") == strings.TrimSpace(out)
}

// statUID is the owner of the file fi describes.
func statUID(fi os.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0)
}
