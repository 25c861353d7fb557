package helper

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/upgrade"
)

// OpUpgrade swaps bcd's binary for an unprivileged node's upgrade.
const OpUpgrade = "upgrade"

// Actions of OpUpgrade.
const (
	// UpgradeInstall verifies a downloaded release and installs it.
	UpgradeInstall = "install"
	// UpgradeRollback puts the previous binary back.
	UpgradeRollback = "rollback"
)

// UpgradeRequest is OpUpgrade's request.
//
// The helper trusts none of it: it replaces only its own binary (the bcd it
// was started from; the node and the helper run the same one), verifies the
// manifest against its own pins (Config.PinsFile, root's file) and checks the
// digest of the bytes it copies. A node can at worst ask for a release signed
// by a pinned key, or for the binary that ran before the last upgrade.
type UpgradeRequest struct {
	// Action is UpgradeInstall or UpgradeRollback.
	Action string `json:"action"`
	// Install is the release to install (UpgradeInstall).
	Install *upgrade.InstallRequest `json:"install,omitempty"`
}

// ownBinary is the executable this process started from, resolved before
// anything can swap it.
var ownBinary, ownBinaryErr = func() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(exe)
}()

// upgrade carries out OpUpgrade.
func (s *Server) upgrade(ctx context.Context, enc *json.Encoder, req *UpgradeRequest) {
	err := s.doUpgrade(ctx, req)
	f := Frame{Done: true}
	if err != nil {
		s.log.WarnContext(ctx, "Helper refused or failed an upgrade", logkey.Err, err)
		f.ExitCode, f.Error = -1, err.Error()
	}
	_ = enc.Encode(f)
}

func (s *Server) doUpgrade(ctx context.Context, req *UpgradeRequest) error {
	target := s.cfg.Binary
	if target == "" {
		if ownBinaryErr != nil {
			return fmt.Errorf("find the bcd binary: %w", ownBinaryErr)
		}
		target = ownBinary
	}
	switch {
	case req == nil:
		return errors.New("upgrade request without an action")
	case req.Action == UpgradeRollback:
		s.log.WarnContext(ctx, "Restoring the previous bcd at the node's request", "path", target)
		return upgrade.Restore(target)
	case req.Action == UpgradeInstall && req.Install != nil:
		pins, err := upgrade.ReadPins(cmp.Or(s.cfg.PinsFile, upgrade.DefaultPinsFile))
		if err != nil {
			return err
		}
		a, err := upgrade.Swap(upgrade.SwapParams{InstallRequest: *req.Install, Target: target, Pins: pins})
		if err != nil {
			return err
		}
		s.log.InfoContext(ctx, "Installed bcd at the node's request", "path", target, "version", req.Install.Version, "sha256", a.SHA256)
		return nil
	}
	return fmt.Errorf("unknown upgrade action %q", req.Action)
}

// Install asks the helper to verify and install a release's bcd
// (upgrade.Installer).
func (c *Client) Install(ctx context.Context, req *upgrade.InstallRequest) error {
	return c.upgrade(ctx, &UpgradeRequest{Action: UpgradeInstall, Install: req})
}

// Rollback asks the helper to put the previous bcd back
// (upgrade.Installer).
func (c *Client) Rollback(ctx context.Context) error {
	return c.upgrade(ctx, &UpgradeRequest{Action: UpgradeRollback})
}

func (c *Client) upgrade(ctx context.Context, req *UpgradeRequest) error {
	f, err := c.do(ctx, Request{Op: OpUpgrade, Upgrade: req}, nil)
	if err != nil {
		return err
	}
	if f.Error != "" {
		return fmt.Errorf("root helper: %s", f.Error)
	}
	return nil
}
