package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
)

// ExecPrefix starts the name of every plugin executable: bcx-<name>.
const ExecPrefix = "bcx-"

// nameRE is what <name> in bcx-<name> may be.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// found is a plugin executable in the plugin directory.
type found struct {
	name, path string
}

// skipped is an entry that looks like a plugin but is refused, and why.
type skipped struct {
	path   string
	reason string
}

// discover lists the plugin executables in dir. A missing dir holds no
// plugins. Entries named bcx-<name> are refused (and returned in skipped)
// when <name> is not lower-case letters, digits, '-' and '_', when they are
// not regular executable files (symbolic links are followed), or when they
// can be changed by others than their owner: group- or world-writable, or,
// when bcd runs as root, not owned by root. The directory itself must not be
// world-writable.
func discover(dir string) ([]found, []skipped, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read plugin directory: %w", err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read plugin directory: %w", err)
	}
	if st.Mode().Perm()&0o002 != 0 {
		return nil, nil, fmt.Errorf("plugin directory %s is world-writable: refusing to run plugins from it", dir)
	}
	var out []found
	var skips []skipped
	for _, e := range entries {
		base := e.Name()
		if len(base) <= len(ExecPrefix) || base[:len(ExecPrefix)] != ExecPrefix {
			continue
		}
		path := filepath.Join(dir, base)
		name := base[len(ExecPrefix):]
		if !nameRE.MatchString(name) {
			skips = append(skips, skipped{path, "name is not bcx- followed by lower-case letters, digits, '-' or '_'"})
			continue
		}
		if why := unsafeExecutable(path); why != "" {
			skips = append(skips, skipped{path, why})
			continue
		}
		out = append(out, found{name: name, path: path})
	}
	return out, skips, nil
}

// unsafeExecutable says why path may not run as a plugin, or "" when it may.
func unsafeExecutable(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return err.Error()
	}
	switch {
	case !st.Mode().IsRegular():
		return "not a regular file"
	case st.Mode().Perm()&0o111 == 0:
		return "not executable"
	case st.Mode().Perm()&0o022 != 0:
		return "group- or world-writable"
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 && sys.Uid != 0 {
		return "bcd runs as root and the file is not owned by root"
	}
	return ""
}
