package main

import (
	"context"
	"errors"
	"fmt"
	"os/user"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/bcd/bmc"
	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/plugin"
	"github.com/better-compute/better-compute/bcd/upgrade"
)

type helperFlags struct {
	nodeUser    string
	socket      string
	logLevel    string
	pinsFile    string
	bmcFile     string
	pluginDir   string
	commandUser string
	dataDir     string
}

func newHelperCmd(e env) *cobra.Command {
	var f helperFlags
	cmd := &cobra.Command{
		Use:   "helper --node-user USER",
		Short: "Run the root helper of an unprivileged bcd node",
		Long: `Helper runs as root beside a bcd node started with --unprivileged. It listens
on a Unix socket (mode 0660, group of the node user) and accepts connections
only from the node user (checked with SO_PEERCRED), never from --command-user,
and only the operations on its allow-list: start the node's commands and
shells as --command-user (bcd-cmd, created when missing; HOME is home/ in
--data-dir), start one as root under a grant bound to its command id, reboot,
and BMC calls (power and boot device, through the plugins in --plugin-dir,
with the credentials the node passes or those of the root-only --bmc-file).
It stops on SIGINT or SIGTERM and removes its socket.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runHelper(cmd.Context(), e, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.nodeUser, "node-user", "", "the user bcd node runs as, the only one served (required)")
	fl.StringVar(&f.socket, "socket", helper.DefaultSocket, "Unix socket to listen on")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.StringVar(&f.pinsFile, "release-pins-file", upgrade.DefaultPinsFile, "pinned release keys the upgrade operation verifies against")
	fl.StringVar(&f.bmcFile, "bmc-file", bmc.DefaultFile, "root-only file of BMC addresses and credentials (mode 0600)")
	fl.StringVar(&f.pluginDir, "plugin-dir", plugin.DefaultDir, "directory of bcx-<name> plugins")
	fl.StringVar(&f.commandUser, "command-user", cmduser.DefaultName, "the user the node's commands and shells without as_root run as (created when missing; never the node user)")
	fl.StringVar(&f.dataDir, "data-dir", identity.DefaultDir, "the node's data directory: the command user's HOME is home/ in it")
	return cmd
}

func runHelper(ctx context.Context, e env, f *helperFlags) error {
	log, err := newLogger(e.stderr, f.logLevel)
	if err != nil {
		return err
	}
	if f.nodeUser == "" {
		return usagef("--node-user is required (the user bcd node runs as, normally bcd)")
	}
	if f.socket == "" {
		return usagef("--socket must not be empty")
	}
	if uid := e.geteuid(); uid != 0 {
		return fmt.Errorf("bcd helper must run as root (it runs root commands for the node), not as uid %d", uid)
	}
	uid, gid, err := lookupUser(f.nodeUser)
	if err != nil {
		return err
	}
	if uid == 0 {
		return usagef("--node-user %s is root: the helper serves an unprivileged node user (normally bcd)", f.nodeUser)
	}
	if f.commandUser == "" || f.dataDir == "" {
		return usagef("--command-user and --data-dir must not be empty")
	}
	home := cmduser.Home(f.dataDir)
	cu, created, err := cmduser.Ensure(ctx, f.commandUser, home)
	if err != nil {
		return err
	}
	if created {
		log.InfoContext(ctx, "Created the command user", logkey.CommandUser, cu.Name, "uid", cu.UID, "gid", cu.GID)
	}
	if err := cu.Check(uid); err != nil {
		return usagef("%v", err)
	}
	ctl := bmc.New(bmc.Config{File: f.bmcFile, PluginDir: f.pluginDir, Logger: log})
	defer ctl.Close()
	srv := helper.NewServer(helper.Config{Socket: f.socket, NodeUID: uid, NodeGID: gid, CommandUser: cu, CommandHome: home,
		PinsFile: f.pinsFile, BMC: ctl}, log)
	if err := srv.Run(ctx); err != nil {
		return err
	}
	log.InfoContext(ctx, "Root helper stopped")
	return nil
}

// lookupUser resolves a user name (or numeric uid) to its uid and primary
// gid.
func lookupUser(name string) (uid, gid uint32, err error) {
	u, err := user.Lookup(name)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		if errors.As(err, &unknown) || errors.As(err, new(user.UnknownUserIdError)) {
			return 0, 0, fmt.Errorf("node user %q does not exist: create it (useradd --system --user-group bcd) or name another with --node-user", name)
		}
		return 0, 0, fmt.Errorf("look up node user %q: %w", name, err)
	}
	u64, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("node user %q: uid %q is not a number", name, u.Uid)
	}
	g64, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("node user %q: gid %q is not a number", name, u.Gid)
	}
	return uint32(u64), uint32(g64), nil
}
