package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// localCommands are the commands that are not calls of the API: those
// that open the database themselves (serve, dev, migrate; pki init and the
// pki issue-* commands, which need the CA keys; doctor, to read; store
// copy, backup and restore, which move a whole database), and
// those that touch no deployment at all. Every other command, and every
// one added from now on, is an API command (DESIGN.md, "Operator CLI").
var localCommands = []string{
	"serve", "dev", "migrate", "doctor", "store copy", "backup", "restore",
	"pki init", "pki issue-gateway", "pki issue-internal",
	"version", "help", "completion bash", "completion zsh", "completion fish", "completion powershell",
	"release keygen", "release manifest", "release sign", "release verify", "release pins sign",
}

// TestOperatorCommandsUseTheAPI walks the command tree: every command but
// localCommands takes the API's --server and --token (apiGroup made it,
// and it calls through e.client), and none of localCommands does.
// cobra's hidden commands (__complete) are left out, as --help leaves them.
func TestOperatorCommandsUseTheAPI(t *testing.T) {
	t.Parallel()
	root := newRoot(&env{getenv: func(string) string { return "" }})
	var leaves []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		if c.HasSubCommands() {
			for _, sub := range c.Commands() {
				walk(sub)
			}
			return
		}
		name := strings.TrimPrefix(c.CommandPath(), root.Name()+" ")
		leaves = append(leaves, name)
		has := func(flag string) bool {
			return c.LocalFlags().Lookup(flag) != nil || c.InheritedFlags().Lookup(flag) != nil
		}
		api := has("server") && has("token")
		switch local := slices.Contains(localCommands, name); {
		case local && api:
			t.Errorf("%s is listed as a local command but takes --server and --token", name)
		case !local && !api:
			t.Errorf("%s takes no --server and --token: a command that changes or reads a deployment is an API command (apiGroup), or belongs in localCommands", name)
		}
	}
	walk(root)
	for _, l := range localCommands {
		if !slices.Contains(leaves, l) {
			t.Errorf("localCommands names %q, which is not a command", l)
		}
	}
}
