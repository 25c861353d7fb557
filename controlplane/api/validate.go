package api

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// checkText refuses a request holding a string that no store keeps as
// text: a NUL character (PostgreSQL's text refuses U+0000) or bytes that are
// not UTF-8 (proto3 strings must be UTF-8). The error names the field by
// its JSON path ("exec.argv[1]", "labels[\"k\"]"), so the caller sees which
// value to fix; nothing of the request reaches the store or the audit log's
// resource column before this check.
func checkText(m protoreflect.Message) *Error {
	return walkText(m, "")
}

func walkText(m protoreflect.Message, prefix string) *Error {
	var bad *Error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		path := prefix + fd.JSONName()
		switch {
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				at := fmt.Sprintf("%s[%q]", path, k.String())
				if fd.MapKey().Kind() == protoreflect.StringKind {
					if bad = textError(path+" key", k.String()); bad != nil {
						return false
					}
				}
				bad = walkValue(fd.MapValue(), mv, at)
				return bad == nil
			})
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				if bad = walkValue(fd, l.Get(i), fmt.Sprintf("%s[%d]", path, i)); bad != nil {
					break
				}
			}
		default:
			bad = walkValue(fd, v, path)
		}
		return bad == nil
	})
	return bad
}

func walkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string) *Error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if e := textError(path, v.String()); e != nil {
			return e
		}
		return lengthError(fd, path, v.String())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return walkText(v.Message(), path+".")
	}
	return nil
}

// lengthError bounds a string by what its field holds (issue 28): an id
// (a field named id or ending in _id or _ids) at most MaxIDBytes, a
// description, note, reason or message at most MaxNoteBytes. Other
// strings are bounded by the body (MaxBodyBytes) and their own checks
// (names, labels).
func lengthError(fd protoreflect.FieldDescriptor, path, s string) *Error {
	n := string(fd.Name())
	switch {
	case n == "id" || strings.HasSuffix(n, "_id") || strings.HasSuffix(n, "_ids"):
		if len(s) > MaxIDBytes {
			return invalid(path, "%s is %d bytes; an id is at most %d", path, len(s), MaxIDBytes)
		}
	case n == "description" || n == "note" || n == "reason" || n == "message" ||
		strings.HasSuffix(n, "_description") || strings.HasSuffix(n, "_note") || strings.HasSuffix(n, "_reason"):
		if len(s) > MaxNoteBytes {
			return invalid(path, "%s is %d bytes; at most %d (1 KiB)", path, len(s), MaxNoteBytes)
		}
	}
	return nil
}

func textError(path, s string) *Error {
	switch {
	case !utf8.ValidString(s):
		return invalid(path, "%s is not valid UTF-8", path)
	case strings.IndexByte(s, 0) >= 0:
		return invalid(path, "%s holds a NUL character (\\u0000), which no field accepts", path)
	}
	return nil
}
