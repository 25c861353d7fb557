package main

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text that came from a node or a caller (hostnames, labels, errors,
// command output) is printed for people with every character that could
// change what they see escaped (issue 29, docs/security.md): C0 and C1
// controls and DEL (terminal escape sequences, carriage returns that
// overwrite a line), Unicode format characters (the bidirectional
// overrides and isolates U+202A-U+202E and U+2066-U+2069, zero-width
// characters), the line and paragraph separators, and bytes that are not
// UTF-8. -o json is printed exactly as the API answers.

// annotationRawOutput, set on a command, leaves its output unescaped: the
// interactive shell, whose bytes are a terminal's.
const annotationRawOutput = "better-compute/raw-output"

// escapeText returns s with those characters escaped as \xNN (controls and
// bytes that are not UTF-8) or \uNNNN (the others). With layout, newlines
// and tabs are kept (free text); without, they are escaped too (a table
// cell, which must stay on its line and in its column).
func escapeText(s string, layout bool) string {
	if !needsEscape(s, layout) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case layout && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case escapedRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// escapedRune reports whether r, outside ASCII controls, is escaped.
func escapedRune(r rune) bool {
	return (r >= 0x80 && r <= 0x9f) || unicode.Is(unicode.Cf, r) || r == 0x2028 || r == 0x2029
}

func needsEscape(s string, layout bool) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || (r < 0x20 && !(layout && (r == '\n' || r == '\t'))) || r == 0x7f || escapedRune(r) {
			return true
		}
		i += n
	}
	return false
}

// escapingWriter escapes what passes through it as escapeText with layout
// does, holding back a rune split across two writes.
type escapingWriter struct {
	w       io.Writer
	pending []byte
}

// Write escapes p (and what an earlier write held back) and writes it.
func (e *escapingWriter) Write(p []byte) (int, error) {
	data := append(e.pending, p...)
	cut := len(data)
	// An incomplete rune at the end waits for the next write.
	for back := 1; back <= utf8.UTFMax-1 && back <= len(data); back++ {
		if c := data[len(data)-back]; utf8.RuneStart(c) {
			if !utf8.FullRune(data[len(data)-back:]) {
				cut = len(data) - back
			}
			break
		}
	}
	e.pending = append([]byte(nil), data[cut:]...)
	if _, err := io.WriteString(e.w, escapeText(string(data[:cut]), true)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is held back, escaped.
func (e *escapingWriter) Flush() error {
	if len(e.pending) == 0 {
		return nil
	}
	_, err := io.WriteString(e.w, escapeText(string(e.pending), true))
	e.pending = nil
	return err
}
