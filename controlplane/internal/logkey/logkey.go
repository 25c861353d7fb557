// Package logkey holds the log attribute keys of better-compute, the
// control plane binary: one spelling of each, used by every package of the
// binary that logs it (tests/logkeys_test.go refuses another spelling, or
// the same one written out).
package logkey

// Keys shared by the control plane's packages.
const (
	// Err is an error value.
	Err = "err"
	// NodeID is a node's id (node_...).
	NodeID = "node_id"
	// CommandID is a command's id (cmd_...).
	CommandID = "command_id"
	// Listener names one of the process's listeners ("gateway", "api",
	// ...), as the internal/accept package labels them.
	Listener = "listener"
)
