package tunnel

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func TestParseLimits(t *testing.T) {
	good := []*sessionv1.TunnelFrame{Data([]byte("ls\n")), Resize(24, 80), Signal("INT"), EOF(), Exit(3, ""), Error("no"),
		{TunnelId: "tun_1"}}
	for _, f := range good {
		got, err := Parse(Encode(f))
		if err != nil || !proto.Equal(got, f) {
			t.Errorf("Parse(%v) = %v, %v", f, got, err)
		}
	}
	bad := map[string][]byte{
		"empty":        nil,
		"big data":     Encode(Data(bytes.Repeat([]byte{1}, MaxData+1))),
		"zero window":  Encode(Resize(0, 80)),
		"huge window":  Encode(Resize(24, MaxWindow+1)),
		"bad signal":   Encode(Signal("SEGV")),
		"garbage":      {0xff, 0xff, 0xff},
		"over a frame": bytes.Repeat([]byte{0}, MaxFrame+1),
	}
	for name, b := range bad {
		if _, err := Parse(b); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: Parse = %v, want ErrFrame", name, err)
		}
	}
}

// FuzzParse: Parse never panics, and a frame it accepts encodes to bytes
// it accepts again as the same frame.
func FuzzParse(f *testing.F) {
	for _, fr := range []*sessionv1.TunnelFrame{Data([]byte("x")), Resize(24, 80), Signal("TERM"), EOF(), Exit(-1, "KILL"), {TunnelId: "t"}} {
		f.Add(Encode(fr))
	}
	f.Add([]byte{0x52, 0x02, 0x08, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("Parse error %v is not ErrFrame", err)
			}
			return
		}
		again, err := Parse(Encode(fr))
		if err != nil || !proto.Equal(again, fr) {
			t.Fatalf("re-parse of %v = %v, %v", fr, again, err)
		}
	})
}
