package tests

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNodeDiskFullRefusesCommands (issue 29, item 3, node side): a real bcd
// whose data dir is a 16 MiB tmpfs, under the real control plane. Once the
// filesystem is full, a command run with the CLI ends failed with
// "disk full on the node's data dir" in `commands get` and its program
// never runs; bcd logs the refusal, stays connected, keeps the result of
// the command that ran before (still succeeded), and starts again on the
// full disk (it exits 0 on SIGTERM). Once space is freed, a command runs.
//
// On the tree at 8bb68ee bcd took the command while its journal's last
// page still had room (the program ran), and otherwise failed it with
// "bcd could not record the command before running it: ... no space left
// on device"; a bcd restarted on the full disk whose journal needed
// compacting refused to start.
func TestNodeDiskFullRefusesCommands(t *testing.T) {
	t.Parallel()
	needRoot(t, "mounting a tmpfs as bcd's data dir needs root")
	d := newDeployment(t, backendSQLite)
	file, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "diskfull-node")
	if err := os.Mkdir(m.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", m.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", m.dataDir).Run() })
	nodeID := m.mustJoin(d.gatewayURL, file)
	node := m.node()
	node.WaitLine(sessionEstablished.String(), 60*time.Second)

	shared := sharedDir(t) // the command user writes there
	// await waits for command id to end and returns it.
	await := func(id string) commandView {
		t.Helper()
		var c commandView
		eventually(t, 60*time.Second, func() bool {
			c = d.command(id)
			return c.State == "succeeded" || c.State == "failed" || c.State == "lost" || c.State == "expired" || c.State == "cancelled"
		}, func() string { return "command " + id + " did not end: " + c.State })
		return c
	}
	before := d.runNoWait(nodeID, nil, "touch", filepath.Join(shared, "before"))
	if c := await(before); c.State != "succeeded" {
		t.Fatalf("a command before the disk fills: %+v", c)
	}

	// Fill the filesystem.
	filler := filepath.Join(m.dataDir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill: %v", err)
			}
			break
		}
	}
	f.Close()

	refused := func(marker string) {
		t.Helper()
		id := d.runNoWait(nodeID, nil, "touch", filepath.Join(shared, marker))
		c := await(id)
		if c.State != "failed" || !strings.Contains(c.Error, "disk full on the node's data dir") {
			t.Errorf("a command on a full disk: %s %q, want failed with disk full on the node's data dir", c.State, c.Error)
		}
		if _, err := os.Stat(filepath.Join(shared, marker)); err == nil {
			t.Errorf("the command %s refused on a full disk ran", id)
		}
	}
	refused("full")
	node.WaitLine(`msg="Refused a command: disk full on the node's data dir"`, 30*time.Second)
	if c := d.command(before); c.State != "succeeded" {
		t.Errorf("the command that ran before the disk filled: %+v, want still succeeded", c)
	}
	// bcd stops cleanly and starts again on the full disk.
	stopClean(t, node)
	node = m.node()
	node.WaitLine(sessionEstablished.String(), 60*time.Second)
	refused("full-again")

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	after := d.runNoWait(nodeID, nil, "touch", filepath.Join(shared, "after"))
	if c := await(after); c.State != "succeeded" {
		t.Errorf("a command once space is freed: %+v", c)
	}
	if _, err := os.Stat(filepath.Join(shared, "after")); err != nil {
		t.Errorf("the command once space is freed did not run: %v", err)
	}
	if c := d.command(before); c.State != "succeeded" {
		t.Errorf("the command that ran before the disk filled: %+v, want still succeeded", c)
	}
	stopClean(t, node)
}
