package plugin

import (
	"os/exec"
	"syscall"
)

// setProcAttr starts the plugin in a process group of its own, so that
// killGroup can end what it started (an ipmitool it was waiting for, say),
// and makes the kernel kill the plugin when bcd dies, so no plugin outlives
// the bcd that started it. (The parent-death signal follows the OS thread
// that forked; Go's runtime does not end threads while the process runs,
// except for goroutines that lock one and exit, which this package does not
// do.)
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills what is left of the process group of an exited plugin
// whose process id was pid (its group id).
func killGroup(pid int) {
	if pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}
