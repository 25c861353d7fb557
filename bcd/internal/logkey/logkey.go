// Package logkey holds the log attribute keys of bcd, the node agent (and
// of its plugins): one spelling of each, used by every package of the
// binary that logs it (tests/logkeys_test.go refuses another spelling, or
// the same one written out).
package logkey

// Keys shared by bcd's packages.
const (
	// Err is an error value.
	Err = "err"
	// NodeID is this node's id (node_...).
	NodeID = "node_id"
	// CommandID is a command's id (cmd_...).
	CommandID = "command_id"
	// CommandUser is the name of the command user, the user commands and
	// shells without as_root run as (package bcd/cmduser).
	CommandUser = "command_user"
)
