package testenv

import (
	"crypto/rand"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Netns is a network namespace the test made, with one address on the
// link to its peer.
type Netns struct {
	// Name is the namespace's name under /run/netns.
	Name string
	// Addr is its address on the veth link (a /30 of its own).
	Addr netip.Addr
}

// Wrap returns the program and arguments that run bin with args inside n.
func (n Netns) Wrap(bin string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", n.Name, bin}, args...)
}

// Link is two network namespaces joined by a veth pair, each with its
// loopback up and one address of a random 10.x.y.0/30: two machines whose
// traffic to each other crosses that link only, and which reach nothing
// else (not even the test host's loopback).
type Link struct {
	A, B Netns
}

// NewLink makes the namespaces and the veth pair; they are deleted when the
// test ends, after the processes it started have been stopped (cleanups
// run last-registered first). It needs root and ip(8) (iproute2): without
// them the test is skipped, except under CI=true, where that is a failure.
func NewLink(t testing.TB) *Link {
	t.Helper()
	if err := netnsUsable(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("network namespaces: %v", err)
		}
		t.Skipf("network namespaces: %v", err)
	}
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("bc%x", r)
	subnet := [4]byte{10, r[0] | 0x80, r[1], r[2] &^ 3}
	l := &Link{
		A: Netns{Name: tag + "a", Addr: netip.AddrFrom4([4]byte{subnet[0], subnet[1], subnet[2], subnet[3] + 1})},
		B: Netns{Name: tag + "b", Addr: netip.AddrFrom4([4]byte{subnet[0], subnet[1], subnet[2], subnet[3] + 2})},
	}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, n := range []Netns{l.A, l.B} {
		ip("netns", "add", n.Name)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.Name).Run() })
	}
	ip("link", "add", tag+"x", "netns", l.A.Name, "type", "veth", "peer", "name", tag+"y", "netns", l.B.Name)
	for _, side := range []struct {
		ns  Netns
		dev string
	}{{l.A, tag + "x"}, {l.B, tag + "y"}} {
		ip("-n", side.ns.Name, "link", "set", "lo", "up")
		ip("-n", side.ns.Name, "addr", "add", side.ns.Addr.String()+"/30", "dev", side.dev)
		ip("-n", side.ns.Name, "link", "set", side.dev, "up")
	}
	return l
}

func netnsUsable() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("making them needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("ip(8) from iproute2: %w", err)
	}
	return nil
}

// RunIn returns the program and arguments that run bin with args on machine
// m (its hostname and machine id) inside network namespace n: a second
// machine of its own, reachable only over the link.
func (m *Machine) RunIn(n Netns, bin string, args ...string) (string, []string) {
	a := append([]string{"netns", "exec", n.Name, "unshare"}, unshareArgs()...)
	a = append(a, "--", "sh", "-c", machineShell, "machine", m.Name, m.IDFile, m.BootIDFile, bin)
	return "ip", append(a, args...)
}
