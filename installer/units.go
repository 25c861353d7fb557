package installer

import (
	"bytes"
	"embed"
	"fmt"
	"text/template"
)

//go:embed units/*.tmpl
var unitFS embed.FS

var unitTemplates = template.Must(template.New("units").Option("missingkey=error").ParseFS(unitFS, "units/*.tmpl"))

// UnitOptions shape the systemd units of bcd.
type UnitOptions struct {
	// BinDir is the folder holding bcd: /usr/bin for the deb and rpm
	// packages, /usr/local/bin for the install script.
	BinDir string
	// Unprivileged runs bcd as the user bcd, sandboxed, beside the root
	// helper unit bcd-helper.service; otherwise bcd runs as root and there is
	// no helper unit.
	Unprivileged bool
}

// Units renders the systemd units for opts, by file name: bcd.service, and
// bcd-helper.service when opts.Unprivileged. packaging/systemd holds the
// units rendered for the packages (BinDir /usr/bin, unprivileged); a test
// keeps them equal.
func Units(opts UnitOptions) (map[string][]byte, error) {
	names := []string{"bcd.service"}
	if opts.Unprivileged {
		names = append(names, "bcd-helper.service")
	}
	out := make(map[string][]byte, len(names))
	for _, name := range names {
		var b bytes.Buffer
		if err := unitTemplates.ExecuteTemplate(&b, name+".tmpl", opts); err != nil {
			return nil, fmt.Errorf("render %s: %w", name, err)
		}
		out[name] = b.Bytes()
	}
	return out, nil
}
