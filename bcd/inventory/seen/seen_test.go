package seen_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/bcd/inventory/seen"
)

// TestGPUCountSeenRecord: the GPUs bcd enumerated stay in the record after
// they vanish and across a restart (a new Open), oldest first, bounded.
func TestGPUCountSeenRecord(t *testing.T) {
	dir := t.TempDir()
	r, err := seen.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	all := []string{"GPU-0", "GPU-1", "GPU-2"}
	if got, err := r.Add(all); err != nil || !slices.Equal(got, all) {
		t.Fatalf("Add = %q, %v", got, err)
	}
	if got, _ := r.Add([]string{"GPU-0", "GPU-2", ""}); !slices.Equal(got, all) {
		t.Errorf("after GPU-1 vanished: %q, want it still recorded", got)
	}
	r2, err := seen.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := r2.Add(nil); !slices.Equal(got, all) {
		t.Errorf("after a restart: %q", got)
	}
	var many []string
	for i := range seen.Max + 5 {
		many = append(many, "GPU-x"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	if got, _ := r2.Add(many); len(got) != seen.Max || got[len(got)-1] != many[len(many)-1] {
		t.Errorf("bounded record: %d entries, last %q", len(got), got[len(got)-1])
	}
	if err := os.WriteFile(filepath.Join(dir, seen.File), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := seen.Open(dir); err == nil {
		t.Error("Open of a corrupt record succeeded")
	}
}
