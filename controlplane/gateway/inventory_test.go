package gateway

import (
	"strings"
	"testing"
	"unicode/utf8"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestGPUsSeenBounds: what a node reports of its GPUs is placed only as
// text within bounds: a UUID too long or not text leaves the GPU out, a
// serial or model too long (a multi-byte name past 128 bytes) or with
// control characters is left empty, never cut mid-character; at most
// maxPlacedGPUs GPUs.
func TestGPUsSeenBounds(t *testing.T) {
	long := strings.Repeat("é", 100) // 200 bytes
	inv := &sessionv1.Inventory{Gpus: []*sessionv1.GPU{
		{Uuid: "GPU-1", Serial: long, Name: "NVIDIA A100-SXM4-80GB"},
		{Uuid: "GPU-2", Serial: "1320", Name: "bad\x1bname"},
		{Uuid: strings.Repeat("x", maxGPUUUIDLen+1)},
		{Uuid: ""},
	}}
	got := gpusSeen(inv)
	if len(got) != 2 || got[0].UUID != "GPU-1" || got[0].Serial != "" || got[0].Model != "NVIDIA A100-SXM4-80GB" ||
		got[1].UUID != "GPU-2" || got[1].Serial != "1320" || got[1].Model != "" {
		t.Fatalf("gpusSeen = %+v", got)
	}
	for _, g := range got {
		if !utf8.ValidString(g.Serial) || !utf8.ValidString(g.Model) {
			t.Errorf("%s: not UTF-8: %q %q", g.UUID, g.Serial, g.Model)
		}
	}
	many := &sessionv1.Inventory{}
	for range maxPlacedGPUs + 10 {
		many.Gpus = append(many.Gpus, &sessionv1.GPU{Uuid: "GPU-x"})
	}
	if n := len(gpusSeen(many)); n != maxPlacedGPUs {
		t.Errorf("%d GPUs placed of %d, want %d", n, len(many.Gpus), maxPlacedGPUs)
	}
}
