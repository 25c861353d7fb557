package main

import (
	"bytes"
	"testing"
)

func TestEscapeText(t *testing.T) {
	for _, tc := range []struct{ in, cell, text string }{
		{"gpu-01", "gpu-01", "gpu-01"},
		{"héllo wörld", "héllo wörld", "héllo wörld"},
		{"evil\u202egnp.exe", `evil\u202egnp.exe`, `evil\u202egnp.exe`},
		{"a\u2066b\u2069\u200bc", `a\u2066b\u2069\u200bc`, `a\u2066b\u2069\u200bc`},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`, `\x1b[31mred\x1b[0m`},
		{"over\rwrite", `over\x0dwrite`, `over\x0dwrite`},
		{"two\nlines\tcol", `two\nlines\tcol`, "two\nlines\tcol"},
		{"c1\u0085\x7f", `c1\u0085\x7f`, `c1\u0085\x7f`},
		{"bad\xff\xfe", `bad\xff\xfe`, `bad\xff\xfe`},
		{"sep\u2028", `sep\u2028`, `sep\u2028`},
	} {
		if got := escapeText(tc.in, false); got != tc.cell {
			t.Errorf("escapeText(%q, cell) = %q, want %q", tc.in, got, tc.cell)
		}
		if got := escapeText(tc.in, true); got != tc.text {
			t.Errorf("escapeText(%q, text) = %q, want %q", tc.in, got, tc.text)
		}
	}
}

// A rune split across writes is escaped (or kept) whole.
func TestEscapingWriterSplitRunes(t *testing.T) {
	in := []byte("é\u202e€x\xff")
	for cut := range len(in) + 1 {
		var b bytes.Buffer
		w := &escapingWriter{w: &b}
		if _, err := w.Write(in[:cut]); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(in[cut:]); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if want := `é\u202e€x\xff`; b.String() != want {
			t.Errorf("split at %d: %q, want %q", cut, b.String(), want)
		}
	}
}
