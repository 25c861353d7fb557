// Package cmduser owns the command user: the dedicated user and group
// (DefaultName, "bcd-cmd") every command and shell without as_root runs as,
// in root mode and unprivileged mode alike, so that no command holds root or
// the rights of the uid bcd runs as (docs/bcd.md, "What a command can
// touch"; issue 27). It resolves and, for a root bcd, creates the user,
// makes its HOME (HomeDir under bcd's data directory) and runs programs as
// it.
//
// Where the rule comes from: the root helper trusts its peer by uid
// (SO_PEERCRED). That check means something only when no command shares
// bcd's uid; and a command that ran as bcd's uid could also read the node's
// key. The helper refuses the command user outright.
package cmduser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/bcd/process"
)

// DefaultName is the command user's name unless --command-user names
// another.
const DefaultName = "bcd-cmd"

// HomeDir is the command user's HOME, relative to bcd's data directory.
const HomeDir = "home"

// User is the command user.
type User struct {
	// Name is the user's name (USER in a command's environment).
	Name string
	// UID and GID are the user's uid and its primary group.
	UID, GID uint32
}

// ErrNotFound is returned by Lookup for a user that does not exist.
var ErrNotFound = errors.New("command user does not exist")

// Lookup resolves name, a user name or a numeric uid, to the command user.
// It fails with an error wrapping ErrNotFound when there is no such user.
func Lookup(name string) (User, error) {
	if name == "" {
		return User{}, errors.New("command user: empty name")
	}
	u, err := user.Lookup(name)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		if errors.As(err, &unknown) || errors.As(err, new(user.UnknownUserIdError)) {
			return User{}, fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		return User{}, fmt.Errorf("look up command user %q: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return User{}, fmt.Errorf("command user %q: uid %q is not a number", name, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return User{}, fmt.Errorf("command user %q: gid %q is not a number", name, u.Gid)
	}
	return User{Name: u.Username, UID: uint32(uid), GID: uint32(gid)}, nil
}

// Ensure returns the command user, creating it (a system user with a group
// of its own, no login shell, useradd(8)) when it is missing; created
// reports that it did. Only root can create it: bcd in root mode calls
// Ensure at start, while an unprivileged bcd and its helper only Lookup.
// Two processes creating it at once both succeed.
func Ensure(ctx context.Context, name, home string) (u User, created bool, err error) {
	u, err = Lookup(name)
	if !errors.Is(err, ErrNotFound) {
		return u, false, err
	}
	if _, perr := strconv.ParseUint(name, 10, 32); perr == nil {
		return User{}, false, fmt.Errorf("command user uid %s does not exist; a numeric --command-user must name an existing user", name)
	}
	var out []byte
	for attempt := range 5 {
		out, err = exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
			"--home-dir", home, "--shell", "/usr/sbin/nologin", "--comment", "Better Compute commands", name).CombinedOutput()
		if u, lerr := Lookup(name); lerr == nil {
			// Made by this call, or by another process at the same time
			// (useradd then fails with "already exists").
			return u, err == nil, nil
		}
		if errors.Is(err, exec.ErrNotFound) {
			break
		}
		// useradd fails when another holds the lock on /etc/passwd.
		select {
		case <-ctx.Done():
			return User{}, false, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
	return User{}, false, fmt.Errorf("create command user %s (useradd --system --user-group %s): %v: %s", name, name, err, out)
}

// Check refuses a command user that would give commands the rights of bcd
// itself: root (uid or group 0) or bcdUID, the uid bcd (or the node user
// the helper serves) runs as.
func (u User) Check(bcdUID uint32) error {
	switch {
	case u.UID == 0 || u.GID == 0:
		return fmt.Errorf("command user %s is root (uid %d, gid %d): commands without as_root must not run as root; name another user with --command-user", u.Name, u.UID, u.GID)
	case u.UID == bcdUID:
		return fmt.Errorf("command user %s has uid %d, the uid bcd runs as: commands must not hold bcd's rights; name another user with --command-user", u.Name, u.UID)
	}
	return nil
}

// Home returns the command user's HOME in bcd's data directory dataDir.
func Home(dataDir string) string { return filepath.Join(dataDir, HomeDir) }

// OpenDataDir lets the command user pass through dataDir to its HOME: it
// adds search (x) for group and others, never read, so nothing in it can be
// listed, and the files in it keep their own modes (the key is 0600). The
// owner of dataDir calls it.
func OpenDataDir(dataDir string) error {
	fi, err := os.Stat(dataDir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if mode := fi.Mode().Perm(); mode&0o011 != 0o011 {
		if err := os.Chmod(dataDir, mode|0o011); err != nil {
			return fmt.Errorf("let the command user reach its home in %s: %w", dataDir, err)
		}
	}
	return nil
}

// MakeHome makes home, the command user's HOME, a directory of u's, mode
// 0700; it must be run as root. A symbolic link there is refused, not
// followed.
func MakeHome(home string, u User) error {
	if err := os.Mkdir(home, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("command user's home: %w", err)
	}
	fd, err := unix.Open(home, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("command user's home %s: %w", home, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("command user's home %s: %w", home, err)
	}
	if st.Uid != u.UID || st.Gid != u.GID {
		if err := unix.Fchown(fd, int(u.UID), int(u.GID)); err != nil {
			return fmt.Errorf("command user's home %s: chown to %s: %w", home, u.Name, err)
		}
	}
	if st.Mode&0o7777 != 0o700 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return fmt.Errorf("command user's home %s: %w", home, err)
		}
	}
	return nil
}

// Reachable reports why the command user cannot reach home, or nil: each
// folder above it must let u search it (x for u as owner, group or other).
// bcd logs the reason at start; the commands would fail to start in home.
func Reachable(home string, u User) error {
	for dir := filepath.Dir(home); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok {
			m := fi.Mode().Perm()
			can := m&0o001 != 0 || st.Uid == u.UID && m&0o100 != 0 || st.Gid == u.GID && m&0o010 != 0
			if !can {
				return fmt.Errorf("%s (mode %v, owner %d:%d) does not let the command user %s through to %s", dir, m, st.Uid, st.Gid, u.Name, home)
			}
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

// Spec returns spec made to run as u: its credentials (u's uid and group,
// no supplementary groups), HOME and USER, and home as its working
// directory unless it names one.
func (u User) Spec(spec process.Spec, home string) process.Spec {
	spec.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
	spec.Home, spec.User = home, u.Name
	if spec.Dir == "" {
		spec.Dir = home
	}
	return spec
}

// Runner runs programs as the command user; it must run as root (bcd in
// root mode, or the root helper).
type Runner struct {
	// User is the command user.
	User User
	// Home is its HOME (Home(dataDir)).
	Home string
}

// Exec runs spec as the command user (process.Run); HOME is made again when
// it was removed.
func (r *Runner) Exec(ctx context.Context, spec process.Spec, out func(stream int, data []byte)) process.Result {
	if err := MakeHome(r.Home, r.User); err != nil {
		return process.Result{ExitCode: -1, Err: err}
	}
	return process.Run(ctx, r.User.Spec(spec, r.Home), out)
}
