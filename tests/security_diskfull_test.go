package tests

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDiskFullAnswersUnavailable (issue 29, item 3): serve on the embedded
// default with its data directory on a small tmpfs. Once the filesystem is
// full, /readyz answers 503 "database disk full" (it said ready before
// issue 29) and a write through the API answers 503 UNAVAILABLE "database
// disk full" (it was a 500 INTERNAL); once space is freed, both recover.
// Needs root to mount the tmpfs (CI runs as root).
func TestDiskFullAnswersUnavailable(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	d.serve.Stop(syscall.SIGTERM, 30*time.Second)
	// Move the data directory onto a 16 MiB tmpfs.
	saved := filepath.Join(t.TempDir(), "saved")
	if out, err := exec.Command("cp", "-a", d.dataDir, saved).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", d.dataDir).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount tmpfs: %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs (not root?): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", d.dataDir).Run() })
	if out, err := exec.Command("cp", "-a", saved+"/.", d.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("cp back: %v %s", err, out)
	}
	d.start()

	readyz := func() (int, string) {
		res, err := http.Get(d.api + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	write := func(name string) (int, string) {
		return apiPost(t, d, "sites.create", d.adminToken, `{"name":"`+name+`","region":"r1"}`)
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before the disk fills: %d %s", code, body)
	}

	// Fill the filesystem.
	filler := filepath.Join(d.dataDir, "filler")
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

	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "database disk full") {
		t.Errorf("/readyz on a full disk: %d %q, want 503 naming database disk full", code, body)
	}
	// Enough writes to need new pages in the write-ahead log: a log reset
	// by a checkpoint is rewritten in place, so the first writes may fit
	// in the pages it already has.
	var code int
	var body string
	for i := 0; i < 5000; i++ {
		if code, body = write(fmt.Sprintf("full-%s-%04d", strings.Repeat("x", 40), i)); code != http.StatusOK {
			break
		}
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"UNAVAILABLE"`) || !strings.Contains(body, "database disk full") {
		t.Errorf("a write on a full disk: %d %s, want 503 UNAVAILABLE database disk full", code, body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Errorf("/readyz once space is freed: %d %s", code, body)
	}
	if code, body := write("after-full"); code != http.StatusOK {
		t.Errorf("a write once space is freed: %d %s", code, body)
	}
}
