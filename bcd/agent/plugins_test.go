package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPluginsIn(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("bcx-ipmi", "#!/bin/sh\necho 'bcx-ipmi 0.2.0 (commit abc)'\n", 0o755)
	write("bcx-broken", "#!/bin/sh\nexit 3\n", 0o755)
	write("bcx-loose", "#!/bin/sh\necho 1.0\n", 0o777)
	write("README", "not a plugin", 0o644)
	got := PluginsIn(dir)()
	if len(got) != 3 {
		t.Fatalf("plugins = %v", got)
	}
	byName := map[string]int{}
	for i, p := range got {
		byName[p.Name] = i
	}
	if p := got[byName["ipmi"]]; !p.Healthy || p.Version != "0.2.0" {
		t.Fatalf("ipmi = %v", p)
	}
	if p := got[byName["broken"]]; p.Healthy || p.Message == "" {
		t.Fatalf("broken = %v", p)
	}
	if p := got[byName["loose"]]; p.Healthy || p.Message == "" {
		t.Fatalf("group-writable plugin = %v", p)
	}
	if none := PluginsIn(filepath.Join(dir, "absent"))(); len(none) != 0 {
		t.Fatalf("absent dir = %v", none)
	}
}
