package tests

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// listening returns the addresses in LISTEN state on port, as the kernel
// lists them in /proc/net/tcp and /proc/net/tcp6: what ss -ltn would show.
func listening(t *testing.T, port int) []netip.AddrPort {
	t.Helper()
	var out []netip.AddrPort
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "0A" { // 0A: TCP_LISTEN
				continue
			}
			hexIP, hexPort, ok := strings.Cut(fields[1], ":")
			p, perr := strconv.ParseUint(hexPort, 16, 16)
			raw, herr := hex.DecodeString(hexIP)
			if !ok || perr != nil || herr != nil || (len(raw) != 4 && len(raw) != 16) {
				f.Close()
				t.Fatalf("%s: cannot read the line %q", file, sc.Text())
			}
			if int(p) != port {
				continue
			}
			// The address is in 32-bit words, each in host (little-endian) order.
			for i := 0; i < len(raw); i += 4 {
				raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
			}
			ip, _ := netip.AddrFromSlice(raw)
			out = append(out, netip.AddrPortFrom(ip, uint16(p)))
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// checkListensOnlyOn fails unless the only listener on want's port is want.
func checkListensOnlyOn(t *testing.T, what string, want netip.AddrPort) {
	t.Helper()
	got := listening(t, int(want.Port()))
	if len(got) != 1 || got[0] != want {
		t.Fatalf("%s: listeners on port %d from /proc/net/tcp and /proc/net/tcp6 = %v, want only %s", what, want.Port(), got, want)
	}
}

// TestPortFlagKeepsConfiguredHost: serve --port P with host.listen on
// 127.0.0.1 listens on 127.0.0.1:P and on no other address (it listened on
// [::]:P before issue 41); --host alone keeps the configured port; dev
// --port and --gateway-port keep the configured hosts too.
func TestPortFlagKeepsConfiguredHost(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	t.Run("serve --port", func(t *testing.T) {
		t.Parallel()
		cfgPort, port := freePort(t), freePort(t)
		p, _ := startServeConfig(t, []string{"BETTER_COMPUTE_DATA_DIR=" + t.TempDir()},
			fmt.Sprintf("host:\n  listen: 127.0.0.1:%d\n  gateway:\n    listen: 127.0.0.1:0\n", cfgPort), "--port", strconv.Itoa(port))
		checkListensOnlyOn(t, "serve --port with host.listen 127.0.0.1", netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", port)))
		if got := listening(t, cfgPort); len(got) != 0 {
			t.Fatalf("serve --port %d still listens on host.listen's port %d: %v", port, cfgPort, got)
		}
		p.Stop(syscall.SIGTERM, 20*time.Second)
	})
	t.Run("serve --host", func(t *testing.T) {
		t.Parallel()
		port := freePortOn(t, "127.0.0.2")
		startServeConfig(t, []string{"BETTER_COMPUTE_DATA_DIR=" + t.TempDir()},
			fmt.Sprintf("host:\n  listen: 0.0.0.0:%d\n  gateway:\n    listen: 127.0.0.1:0\n", port), "--host", "127.0.0.2")
		checkListensOnlyOn(t, "serve --host 127.0.0.2 with host.listen 0.0.0.0", netip.MustParseAddrPort(fmt.Sprintf("127.0.0.2:%d", port)))
	})
	t.Run("dev --port", func(t *testing.T) {
		t.Parallel()
		port, gwPort := freePortOn(t, "127.0.0.2"), freePortOn(t, "127.0.0.2")
		cfg := testenv.WriteFile(t, "better-compute.yaml", "host:\n  listen: 127.0.0.2:1\n  gateway:\n    listen: 127.0.0.2:2\n")
		p := testenv.Start(t, testenv.BaseEnv(), bin, "dev", "--config", cfg, "--sim", "0", "--data-dir", t.TempDir(),
			"--port", strconv.Itoa(port), "--gateway-port", strconv.Itoa(gwPort))
		p.WaitLine(`Press Ctrl-C to stop`, 90*time.Second)
		checkListensOnlyOn(t, "dev --port with host.listen 127.0.0.2", netip.MustParseAddrPort(fmt.Sprintf("127.0.0.2:%d", port)))
		checkListensOnlyOn(t, "dev --gateway-port with host.gateway.listen 127.0.0.2", netip.MustParseAddrPort(fmt.Sprintf("127.0.0.2:%d", gwPort)))
	})
}
