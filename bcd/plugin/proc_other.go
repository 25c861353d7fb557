//go:build !linux

package plugin

import "os/exec"

// setProcAttr does nothing off Linux.
func setProcAttr(*exec.Cmd) {}

// killGroup does nothing off Linux.
func killGroup(int) {}
