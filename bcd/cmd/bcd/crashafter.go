//go:build crashafter

// The crashafter build of bcd (go build -tags crashafter -ldflags "-X
// main.crashAfter=5s" ./bcd/cmd/bcd), for end-to-end tests of a release
// that crash-loops (issue 30): bcd node, outside an upgrade's trial, exits
// with status 1 crashAfter after it starts (45 s unless the build sets
// another Go duration), as a release that starts, connects and then dies
// would. Production builds (no tag) do not contain this file.

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// crashAfter is how long bcd node runs before it exits, a Go duration; set
// with -ldflags "-X main.crashAfter=...".
var crashAfter = "45s"

func init() {
	d, err := time.ParseDuration(crashAfter)
	if err != nil || d <= 0 {
		fmt.Fprintf(os.Stderr, "bcd: the crashafter build's crashAfter %q is not a positive duration\n", crashAfter)
		os.Exit(2)
	}
	testCrash = func(ctx context.Context, log *slog.Logger) {
		log.WarnContext(ctx, "Test build crashafter: this bcd exits with status 1 after "+d.String())
		time.AfterFunc(d, func() {
			log.Error("Test build crashafter: exiting with status 1")
			os.Exit(1)
		})
	}
}
