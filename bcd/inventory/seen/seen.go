// Package seen records the GPUs bcd has enumerated on this machine, in its
// data directory, so that a GPU that falls off the bus (and so vanishes
// from NVML) can still be named: the control plane compares the node's
// GPU count with the count it expects and names the missing GPU from this
// record (docs/gpu-health.md, "GPU count").
package seen

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// File is the record's name in the data directory.
const File = "gpus-seen.json"

// Max bounds the record: past it the oldest UUIDs are forgotten.
const Max = 64

// Record is the GPUs seen, oldest first. It is safe for concurrent use.
type Record struct {
	path string
	mu   sync.Mutex
	ids  []string
}

// Open reads the record in dir (none yet is an empty record). A record
// that cannot be parsed is an error naming the file.
func Open(dir string) (*Record, error) {
	r := &Record{path: filepath.Join(dir, File)}
	b, err := os.ReadFile(r.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return r, nil
	case err != nil:
		return nil, fmt.Errorf("read GPUs seen: %w", err)
	}
	var doc struct {
		GPUs []string `json:"gpus"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("read GPUs seen: %s: %w", r.path, err)
	}
	r.ids = doc.GPUs[max(len(doc.GPUs)-Max, 0):]
	return r, nil
}

// Add records uuids (empty ones skipped) and writes the file when one is
// new (atomically: a temporary file renamed over it). It returns every
// UUID seen, oldest first.
func (r *Record) Add(uuids []string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	for _, u := range uuids {
		if u != "" && !slices.Contains(r.ids, u) {
			r.ids, changed = append(r.ids, u), true
		}
	}
	r.ids = r.ids[max(len(r.ids)-Max, 0):]
	if !changed {
		return slices.Clone(r.ids), nil
	}
	b, err := json.Marshal(map[string][]string{"gpus": r.ids})
	if err != nil {
		return nil, err
	}
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return slices.Clone(r.ids), fmt.Errorf("write GPUs seen: %w", err)
	}
	if err := os.Rename(tmp, r.path); err != nil {
		return slices.Clone(r.ids), fmt.Errorf("write GPUs seen: %w", err)
	}
	return slices.Clone(r.ids), nil
}
