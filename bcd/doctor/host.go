package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/helper"
)

// pluginPrefix starts every plugin executable's name (bcx-<name>).
const pluginPrefix = "bcx-"

// NVML initialises NVML and reports the driver and GPU count. A host without
// the NVIDIA driver (ERROR_LIBRARY_NOT_FOUND, ERROR_DRIVER_NOT_LOADED) warns:
// normal on a machine without GPUs, a fault on one with them.
func NVML(lib nvml.Interface) Result {
	ret := lib.Init()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return result(IDNVML, "", Warn, "no NVIDIA driver: no GPUs are reported (normal on a host without GPUs)", nvml.ErrorString(ret))
	default:
		return result(IDNVML, "", Fail, "NVML does not start: "+nvml.ErrorString(ret)+"; check the driver (nvidia-smi)")
	}
	defer lib.Shutdown()
	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driver = "unknown (" + nvml.ErrorString(ret) + ")"
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return result(IDNVML, "", Fail, "NVML cannot count the GPUs: "+nvml.ErrorString(ret), "driver "+driver)
	}
	if n == 0 {
		return result(IDNVML, "", Warn, "the NVIDIA driver is loaded but sees no GPU", "driver "+driver)
	}
	var names []string
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			names = append(names, fmt.Sprintf("%d: %s", i, nvml.ErrorString(ret)))
			continue
		}
		name, ret := d.GetName()
		if ret != nvml.SUCCESS {
			name = nvml.ErrorString(ret)
		}
		names = append(names, fmt.Sprintf("%d: %s", i, name))
	}
	return result(IDNVML, "", OK, fmt.Sprintf("NVML sees %d GPU(s), driver %s", n, driver), strings.Join(names, ", "))
}

// Helper pings the root helper on socket. A missing socket is fine unless
// it was named (named): the helper runs only beside bcd node --unprivileged.
// A helper that refuses this process warns: it accepts only the node user.
func Helper(ctx context.Context, socket string, named bool, timeout time.Duration) Result {
	if _, err := os.Stat(socket); errors.Is(err, fs.ErrNotExist) && !named {
		return result(IDHelper, socket, OK, "no root helper socket: needed only with bcd node --unprivileged")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := (&helper.Client{Socket: socket}).Ping(ctx)
	switch {
	case err == nil:
		return result(IDHelper, socket, OK, "the root helper answers")
	case errors.Is(err, helper.ErrRefused):
		return result(IDHelper, socket, Warn, "the root helper refused this user: it accepts only the node user; run bcd doctor as that user", err.Error())
	case errors.Is(err, helper.ErrUnavailable):
		return result(IDHelper, socket, Fail, "no root helper listens: start bcd-helper.service", err.Error())
	}
	return result(IDHelper, socket, Fail, "the root helper does not answer: "+oneLine(err))
}

// Plugins lists the plugin directory: it must not be writable by everyone
// (bcd refuses to run plugins from it), and each bcx-<name> in it must be an
// executable that prints its version when run with --version (what
// installers check; plugins answer it without bcd's handshake).
func Plugins(ctx context.Context, dir string, timeout time.Duration) []Result {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return []Result{result(IDPlugins, dir, OK, "no plugin directory: no plugins installed")}
	case err != nil:
		return []Result{result(IDPlugins, dir, Fail, "cannot read the plugin directory", err.Error())}
	case !fi.IsDir():
		return []Result{result(IDPlugins, dir, Fail, "the plugin path is not a directory")}
	case fi.Mode().Perm()&0o002 != 0:
		return []Result{result(IDPlugins, dir, Fail, "the plugin directory is writable by everyone: bcd refuses to run plugins from it; chmod o-w")}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return []Result{result(IDPlugins, dir, Fail, "cannot list the plugin directory", err.Error())}
	}
	var out []Result
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), pluginPrefix) {
			continue
		}
		names = append(names, e.Name())
		out = append(out, plugin(ctx, filepath.Join(dir, e.Name()), timeout))
	}
	if len(names) == 0 {
		return []Result{result(IDPlugins, dir, OK, "no plugins installed")}
	}
	return append([]Result{result(IDPlugins, dir, OK, fmt.Sprintf("%d plugin(s)", len(names)), strings.Join(names, ", "))}, out...)
}

// plugin checks one plugin executable.
func plugin(ctx context.Context, path string, timeout time.Duration) Result {
	name := filepath.Base(path)
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return result(IDPlugin, name, Fail, "cannot stat the plugin", err.Error())
	case !fi.Mode().IsRegular():
		return result(IDPlugin, name, Fail, "not a regular file")
	case fi.Mode().Perm()&0o111 == 0:
		return result(IDPlugin, name, Fail, "not executable: chmod +x "+path)
	case fi.Mode().Perm()&0o002 != 0:
		return result(IDPlugin, name, Fail, "writable by everyone: chmod o-w "+path)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	// Plugins start with an environment of their own, never bcd's.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var outBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
	err = cmd.Run()
	first, _, _ := strings.Cut(strings.TrimSpace(outBuf.String()), "\n")
	switch {
	case ctx.Err() != nil:
		return result(IDPlugin, name, Fail, fmt.Sprintf("%s --version did not answer within %s", name, timeout))
	case err != nil:
		return result(IDPlugin, name, Fail, fmt.Sprintf("%s --version failed: %s", name, oneLine(err)), first)
	}
	return result(IDPlugin, name, OK, "version: "+first)
}
