package bootstrap

import (
	"net"
	"os"
	"path/filepath"
	"strings"
)

// APIURLFile, in the data directory, holds the URL a CLI on this machine
// reaches the running API by, with its base path
// (https://127.0.0.1:3000/api when the API serves TLS, http:// otherwise),
// written by serve each time the API starts listening. The CLI reads it
// when no --server or BETTER_COMPUTE_URL names the server, so `better-compute
// nodes add` works beside `serve --public-url` without flags; doctor reads
// it to know how the running API serves.
const APIURLFile = "api-url"

// RecordedAPIURL is the URL a serve on dataDir recorded in APIURLFile, and
// that file's path; "" when there is none or it holds no http(s) URL.
func RecordedAPIURL(dataDir string) (url, path string) {
	path = filepath.Join(dataDir, APIURLFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	u := strings.TrimSpace(string(b))
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return "", ""
	}
	return u, path
}

// APIListenFile, in the data directory, holds the address the API of a
// serve on this data directory is bound to (127.0.0.1:3000, [::]:3000),
// written with APIURLFile each time the API starts listening. doctor's
// api.tls judges plain HTTP by it, since flags (serve --host, dev's
// loopback default) decide the address as much as host.listen does.
const APIListenFile = "api-listen"

// RecordedAPIListen is the address a serve on dataDir recorded in
// APIListenFile, and that file's path; "" when there is none or it holds
// no host:port.
func RecordedAPIListen(dataDir string) (addr, path string) {
	path = filepath.Join(dataDir, APIListenFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	a := strings.TrimSpace(string(b))
	if _, _, err := net.SplitHostPort(a); err != nil {
		return "", ""
	}
	return a, path
}
