package tests

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// otherUID is a uid that is not the node user's: nobody.
const otherUID = 65534

// nodeUser is a system user made for one test.
type nodeUser struct {
	name     string
	uid, gid uint32
}

func (u nodeUser) cred() *syscall.Credential {
	return &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{}}
}

// needRoot skips a test that needs root, except under CI=true, where the
// tests run as root and a skip would hide a failure.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but not running as root: %s", why)
	}
	t.Skipf("not root: %s", why)
}

// newNodeUser creates an unprivileged system user, bctest-<random>, with a
// group of its own, and deletes both when the test ends.
func newNodeUser(t *testing.T) nodeUser {
	t.Helper()
	needRoot(t, "creating a user and running the root helper need root")
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Fatalf("useradd: %v", err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "bctest-" + hex.EncodeToString(b[:])
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group",
		"--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
		_ = exec.Command("groupdel", name).Run() // gone with the user where USERGROUPS_ENAB is set
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return nodeUser{name: name, uid: uint32(uid), gid: uint32(gid)}
}

// openDir returns a fresh folder that every user can enter, removed when
// the test ends.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bc-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// awaitMessage returns the next message of s for which match is true.
func awaitMessage(t *testing.T, s *sessiontest.Session, what string, match func(*sessionv1.NodeMessage) bool) *sessionv1.NodeMessage {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case m := <-s.Messages():
			if match(m) {
				return m
			}
		case <-s.Done():
			t.Fatalf("session ended while waiting for %s", what)
		case <-deadline:
			t.Fatalf("no %s within 30 s", what)
		}
	}
}

// execOn sends an exec command on s and returns its result and stdout.
func execOn(t *testing.T, s *sessiontest.Session, id string, asRoot bool, argv ...string) (*sessionv1.CommandResult, string) {
	t.Helper()
	err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{
		Id: id, Kind: "exec",
		Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: argv, AsRoot: asRoot}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	m := awaitMessage(t, s, "result of "+id, func(m *sessionv1.NodeMessage) bool {
		u := m.GetCommandUpdate()
		if u.GetCommandId() != id {
			return false
		}
		if o := u.GetOutput(); o.GetStream() == sessionv1.OutputStream_OUTPUT_STREAM_STDOUT {
			stdout.Write(o.GetData())
		}
		return u.GetResult() != nil
	})
	return m.GetCommandUpdate().GetResult(), stdout.String()
}

// TestUnprivilegedNodeBesideRootHelper runs a real `bcd node --unprivileged`
// as a fresh system user beside a real root `bcd helper`, against an
// in-process test gateway: plain commands run as the command user
// through the helper (neither root nor the node user), root commands run
// as root through the helper under a grant, the helper refuses every other
// uid, a plain command that connects to the helper's socket is refused and
// cannot read /etc/shadow, and without the helper commands fail with a
// clear error.
func TestUnprivilegedNodeBesideRootHelper(t *testing.T) {
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
	sock := filepath.Join(base, "run", "helper.sock")

	if code, out, errOut := testenv.RunAs(t, u.cred(), []string{"BCD_JOIN_TOKEN=" + tok}, "", bcd,
		"join", "--gateway", g.URL, "--data-dir", data); code != 0 {
		t.Fatalf("bcd join as %s: exit %d: %s %s", u.name, code, out, errOut)
	}

	cu := newNodeUser(t) // the command user of this helper
	hp := testenv.Start(t, nil, bcd, "helper", "--node-user", u.name, "--command-user", cu.name, "--data-dir", data, "--socket", sock)
	hp.WaitLine(`Root helper listening`, 30*time.Second)
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Uid != 0 || st.Gid != u.gid {
		t.Errorf("helper socket: mode %v, owner %d:%d; want 0660 root:%d", fi.Mode().Perm(), st.Uid, st.Gid, u.gid)
	}

	node := testenv.StartAs(t, u.cred(), nil, bcd, "node", "--unprivileged", "--helper-socket", sock, "--data-dir", data)
	node.WaitLine(`Root helper answers`, 30*time.Second)
	s := g.NextSession(t, 30*time.Second)
	awaitMessage(t, s, "inventory", func(m *sessionv1.NodeMessage) bool { return m.GetInventory() != nil })

	// A plain exec runs as the command user, in its HOME in the data dir.
	res, out := execOn(t, s, "cmd_user", false, "sh", "-c", "echo $(id -u) $(pwd)")
	if want := fmt.Sprintf("%d %s", cu.uid, filepath.Join(data, cmduser.HomeDir)); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || strings.TrimSpace(out) != want {
		t.Errorf("id -u as the command user: %v, output %q, want %q (node user %d)", res, out, want, u.uid)
	}
	// Such a command cannot use the helper: the socket (0660 root:node
	// group) does not let it connect, and the helper refuses its uid.
	if perl, err := exec.LookPath("perl"); err == nil {
		res, out = execOn(t, s, "cmd_sneak", false, perl, "-MIO::Socket::UNIX", "-e",
			`$SIG{PIPE} = "IGNORE"; my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect: $!\n"; `+
				`print $s qq({"op":"exec","exec":{"argv":["cat","/etc/shadow"],"as_root":true,"command_id":"cmd_sneak"}}\n); print scalar <$s>`,
			sock)
		if res.GetState() == sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || strings.Contains(out, "root:") {
			t.Errorf("a plain command reached the helper: %v, output %q", res, out)
		}
		t.Logf("a plain command connecting to the helper: %s, %q", res.GetError(), out)
	}
	if res, out := execOn(t, s, "cmd_shadow", false, "cat", "/etc/shadow"); res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || strings.Contains(out, "root:") {
		t.Errorf("cat /etc/shadow as the command user: %v, output %q", res, out)
	}
	// The helper refuses the command user by uid, also where the socket's
	// mode would let it in (its group given to it here).
	if perl, err := exec.LookPath("perl"); err == nil {
		_, pout, perr := testenv.RunAs(t, &syscall.Credential{Uid: cu.uid, Gid: u.gid, Groups: []uint32{}}, nil, "", perl,
			"-MIO::Socket::UNIX", "-e",
			`$SIG{PIPE} = "IGNORE"; my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect: $!\n"; `+
				`print $s qq({"op":"grant","grant":{"id":"cmd_x"}}\n); print scalar <$s>`,
			sock)
		if !strings.Contains(pout, "it is the command user") {
			t.Errorf("connection from the command user: %q %q, want a refusal", pout, perr)
		}
		hp.WaitLine(`Helper refused a connection from the command user`, 10*time.Second)
	}
	// A root exec runs as root, through the helper.
	res, out = execOn(t, s, "cmd_root", true, "id", "-u")
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || strings.TrimSpace(out) != "0" {
		t.Errorf("id -u as root: %v, output %q, want 0", res, out)
	}
	hp.WaitLine(`Running as root for the node.*program=id command_id=cmd_root`, 10*time.Second)

	// Other uids are refused by peer credentials: this test process (root,
	// which the socket's mode lets in) ...
	err = (&helper.Client{Socket: sock}).Ping(t.Context())
	if !errors.Is(err, helper.ErrRefused) || !strings.Contains(err.Error(), "uid 0 may not use the root helper") {
		t.Errorf("ping from uid 0: %v, want refused", err)
	}
	// ... and a process of another uid in the node user's group.
	if perl, err := exec.LookPath("perl"); err == nil {
		_, pout, perr := testenv.RunAs(t, &syscall.Credential{Uid: otherUID, Gid: u.gid, Groups: []uint32{}}, nil, "", perl,
			"-MIO::Socket::UNIX", "-e",
			`$SIG{PIPE} = "IGNORE"; my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect: $!\n"; `+
				`print $s qq({"op":"exec","exec":{"argv":["id","-u"]}}\n); print scalar <$s>`,
			sock)
		if !strings.Contains(pout, "uid 65534 may not use the root helper") {
			t.Errorf("connection from uid %d: %q %q, want a refusal", otherUID, pout, perr)
		}
		hp.WaitLine(`Helper refused a connection from another user.*uid=65534`, 10*time.Second)
	} else {
		t.Logf("perl not found: the refusal of another unprivileged uid is checked for uid 0 only")
	}

	// Without the helper, root commands fail and say why.
	hp.Stop(syscall.SIGTERM, 10*time.Second)
	if code := hp.Wait(time.Second); code != 0 {
		t.Errorf("helper exit status %d after SIGTERM", code)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("helper socket left behind: %v", err)
	}
	res, _ = execOn(t, s, "cmd_root_nohelper", true, "id", "-u")
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.GetError(), helper.ErrUnavailable.Error()) {
		t.Errorf("root exec without the helper: %v, want FAILED with %q", res, helper.ErrUnavailable)
	}
	// Plain ones too (the helper starts them), and the node keeps running.
	if res, _ := execOn(t, s, "cmd_after", false, "echo", "still here"); res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.GetError(), helper.ErrUnavailable.Error()) {
		t.Errorf("plain exec without the helper: %v, want FAILED with %q", res, helper.ErrUnavailable)
	}
	if res := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{Id: "cmd_refresh", Kind: "inventory.refresh"}}}); res != nil {
		t.Fatal(res)
	}
	awaitMessage(t, s, "inventory.refresh's result", func(m *sessionv1.NodeMessage) bool {
		r := m.GetCommandUpdate().GetResult()
		return m.GetCommandUpdate().GetCommandId() == "cmd_refresh" && r.GetState() == sessionv1.CommandState_COMMAND_STATE_SUCCEEDED
	})
}
