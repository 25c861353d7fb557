package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/serve"
)

// apiListener is what the banner needs of the API server (*api.Server,
// which only serve.go and dev.go name: tests/deps_test.go).
type apiListener interface {
	Addr() net.Addr
	PublicURL() string
}

// apiURLOf is the API's origin as dev and serve print it: the bound
// address, or the public URL when the API listens on every address.
func apiURLOf(cfg *config.Config, srv apiListener) string {
	if a, ok := srv.Addr().(*net.TCPAddr); ok && a.IP.IsUnspecified() {
		return srv.PublicURL()
	}
	return cfg.APIScheme() + "://" + srv.Addr().String()
}

// adminTokenNote says where the CLI finds the admin token: the embedded
// default's file in the data directory when there is one, else how to
// give one.
func adminTokenNote(cfg *config.Config) string {
	path := filepath.Join(cfg.DataDir, serve.AdminTokenFile)
	if _, err := os.Stat(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return "admin token in " + path
	}
	return "give the CLI a token with --token or BETTER_COMPUTE_TOKEN"
}

// serveBanner prints serve's banner, one part as each role listens: what
// runs and where its data is first, then the API (with where the admin
// token is and the next step) and the gateway. A process without the api
// or gateway role prints only what it runs.
type serveBanner struct {
	w   io.Writer
	cfg *config.Config
}

func (b serveBanner) header() {
	roles := "all roles"
	if !b.cfg.AllRoles() {
		roles = "roles " + strings.Join(b.cfg.RolesList, ",")
	}
	where := "data directory " + b.cfg.DataDir
	if !b.cfg.Embedded {
		where = "PostgreSQL; " + where
	}
	fmt.Fprintf(b.w, "Better Compute serve: %s (%s). Ctrl-C stops it.\n", roles, where)
}

func (b serveBanner) api(srv apiListener) {
	// One write: the gateway's line may come at the same time.
	fmt.Fprintf(b.w, "  API      %s%s  (%s)\n  add a machine: better-compute nodes add --pool default (README.md, docs/install.md)\n",
		apiURLOf(b.cfg, srv), b.cfg.BasePath, adminTokenNote(b.cfg))
}

func (b serveBanner) gateway(gw *gateway.Gateway) {
	fmt.Fprintf(b.w, "  gateway  %s\n", gw.PublicURL())
}
