// Command bcx-ipmi is bcd's BMC plugin: power, boot device and BMC
// information through bmclib (ipmitool and Redfish). bcd starts it from its
// plugin directory (/usr/lib/bcd/plugins); run by hand it only answers
// --version.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/better-compute/better-compute/bcd/plugin"
	"github.com/better-compute/better-compute/plugins/ipmi"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "0.0.0-dev"
	commit  = "none"
)

func main() {
	if plugin.IsVersionFlag(os.Args[1:]) {
		fmt.Printf("bcx-ipmi %s (%s)\n", version, commit)
		return
	}
	// gofish dumps every request, the Redfish login's password included, to
	// stdout when DEBUG_BMCLIB=true. bcd gives plugins a clean environment;
	// this makes sure of it.
	_ = os.Unsetenv("DEBUG_BMCLIB")
	log := slog.New(plugin.NewLogHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	plugin.Serve(ipmi.New(ipmi.Config{Version: version, Logger: log}), log)
}
