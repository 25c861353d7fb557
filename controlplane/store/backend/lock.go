package backend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// LockFile is the file in the embedded default's data directory that a
// process using the deployment holds a flock on: serve and dev shared, the
// operator commands that read or replace the whole database (store copy,
// restore) exclusive. SQLite's own locks are on state.db and its -wal and
// -shm files, which this one never touches.
const LockFile = "serve.lock"

// ErrDataDirInUse reports a data directory whose LockFile another process
// holds in a way that excludes the caller.
var ErrDataDirInUse = errors.New("the data directory is in use")

// DataDirLock is a flock held on a data directory's LockFile, released by
// Release or by the process's end (kill -9 included).
type DataDirLock struct{ f *os.File }

// LockDataDir takes the lock on dir's LockFile without waiting: shared
// (serve, dev: the deployment is running) or exclusive (store copy,
// restore: nothing may run on it). On success holder, such as
// "better-compute serve (pid 42)", is written into the file, so that the
// next process refused can name it. A lock it cannot take fails wrapping
// ErrDataDirInUse and naming the recorded holder. dir must exist.
func LockDataDir(dir string, exclusive bool, holder string) (*DataDirLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is held by %s", ErrDataDirInUse, dir, LockHolder(dir))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Shared holders each write their own name; the last one stays.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(holder+"\n"), 0)
	}
	return &DataDirLock{f: f}, nil
}

// LockHolder is what the last process that took dir's lock wrote into
// LockFile ("a running process" when it cannot be read).
func LockHolder(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, LockFile))
	if s := strings.TrimSpace(string(b)); err == nil && s != "" {
		return s
	}
	return "a running process"
}

// Release unlocks and closes the file.
func (l *DataDirLock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the only descriptor drops the flock
	l.f = nil
	return err
}
