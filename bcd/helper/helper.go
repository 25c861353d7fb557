// Package helper is bcd's root helper: a small root process on a Unix socket
// that does the few privileged things an unprivileged bcd node may ask for
// (DESIGN.md, "bcd"). It accepts connections only from the configured node
// user, checked with SO_PEERCRED, never from the command user (package
// bcd/cmduser), and only operations on its allow-list. It starts the
// commands and shells of an unprivileged bcd as the command user, and a root
// process only under a grant (OpGrant) bound to the command's or tunnel's id.
//
// The protocol is one operation per connection, newline-delimited JSON: the
// client sends one Request; the helper answers with zero or more Frame
// values carrying output and a last Frame with Done set. A client that closes
// its connection cancels the operation, and the helper kills the process
// group of an exec it started.
package helper

import (
	"encoding/json"
	"errors"
	"syscall"

	"github.com/better-compute/better-compute/bcd/bmc"
)

// DefaultSocket is where the helper listens.
const DefaultSocket = "/run/bcd/helper.sock"

// Operations on the allow-list.
const (
	OpPing = "ping"
	// OpExec runs a program as root, under a grant (OpGrant) for its
	// command id.
	OpExec = "exec"
	// OpExecUser runs a program as the command user. It is an operation of
	// its own, not a flag of OpExec, so that a helper older than the
	// command user refuses it (off its allow-list) rather than running it
	// as root.
	OpExecUser = "exec.user"
	OpReboot   = "reboot"
	OpBMC      = "bmc"
	// OpKmsgXid streams the kernel log's NVRM Xid records (and nothing
	// else of the log) until the client closes the connection.
	OpKmsgXid = "kmsg.xid"
)

// Request is the one message a client sends.
type Request struct {
	Op   string    `json:"op"`
	Exec *ExecSpec `json:"exec,omitempty"`
	// Upgrade is the call of OpUpgrade.
	Upgrade *UpgradeRequest `json:"upgrade,omitempty"`
	// BMC is the call of OpBMC.
	BMC *bmc.Request `json:"bmc,omitempty"`
	// Shell is the call of OpShell.
	Shell *ShellSpec `json:"shell,omitempty"`
	// Grant is the call of OpGrant.
	Grant *GrantRequest `json:"grant,omitempty"`
	// Pins is the call of OpPinsApply.
	Pins *PinsRequest `json:"pins,omitempty"`
}

// ExecSpec is a program to run: as root (OpExec, where Grant must be a
// grant for CommandID), or as the command user (OpExecUser).
type ExecSpec struct {
	Argv        []string          `json:"argv"`
	Env         map[string]string `json:"env,omitempty"`
	Dir         string            `json:"dir,omitempty"`
	OutputLimit int64             `json:"output_limit,omitempty"`
	// CommandID is the id of the command the program runs for.
	CommandID string `json:"command_id,omitempty"`
	// Grant is the token OpGrant returned for CommandID (OpExec only).
	Grant string `json:"grant,omitempty"`
}

// Frame is one message the helper sends.
type Frame struct {
	// Stream and Data carry output (exec): 1 stdout, 2 stderr.
	Stream int    `json:"stream,omitempty"`
	Data   []byte `json:"data,omitempty"`
	// Done ends the answer.
	Done      bool   `json:"done,omitempty"`
	ExitCode  int    `json:"exit_code"`
	Truncated bool   `json:"truncated,omitempty"`
	Cancelled bool   `json:"cancelled,omitempty"`
	Error     string `json:"error,omitempty"`
	// Result is OpBMC's bmc.Result, also when Error is set.
	Result json.RawMessage `json:"result,omitempty"`
	// Signal is OpShell's: the number of the signal that ended the shell.
	Signal string `json:"signal,omitempty"`
	// Grant is OpGrant's answer: the grant's token.
	Grant string `json:"grant,omitempty"`
}

// ErrUnavailable is returned by the client when no helper listens: root work
// needs bcd-helper.service.
var ErrUnavailable = errors.New("the bcd root helper is not running (start bcd-helper.service); privileged commands need it")

// ErrRefused is returned when the helper refused the operation.
var ErrRefused = errors.New("refused by the bcd root helper")

// peerUID reads the uid of the process on the other end of a Unix socket.
func peerUID(fd uintptr) (uint32, error) {
	cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	if err != nil {
		return 0, err
	}
	return cred.Uid, nil
}
