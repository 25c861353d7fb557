package transfer

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"slices"
	"time"
)

// fromSQLite converts a value read from the source's column c to what the
// target's column takes.
func (c column) fromSQLite(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	switch c.kind {
	case kindText, kindJSON:
		switch x := v.(type) {
		case string:
			return x, nil
		case []byte:
			return string(x), nil
		}
	case kindInt:
		if x, ok := v.(int64); ok {
			return x, nil
		}
	case kindBool:
		if x, ok := v.(int64); ok {
			return x != 0, nil
		}
	case kindTime:
		if x, ok := v.(int64); ok {
			return time.UnixMicro(x).UTC(), nil
		}
	case kindBytes:
		switch x := v.(type) {
		case []byte:
			return x, nil
		case string:
			return []byte(x), nil
		}
	case kindFloat:
		switch x := v.(type) {
		case float64:
			return x, nil
		case int64: // SQLite keeps a whole REAL as an integer
			return float64(x), nil
		}
	}
	return nil, fmt.Errorf("column %s: a %T value where the schema wants %s", c.name, v, c.kind)
}

func (k kind) String() string {
	return [...]string{"text", "an integer", "a boolean", "a timestamp", "JSON", "bytes", "a number"}[k]
}

// canonical appends the canonical form of v, a value of column c as the
// target takes it (fromSQLite's result) or as the target returns it (JSON
// selected as text), to buf.
func (c column) canonical(buf []byte, v any) ([]byte, error) {
	if v == nil {
		return append(buf, 'N'), nil
	}
	bad := func() ([]byte, error) {
		return nil, fmt.Errorf("column %s: a %T value where the schema wants %s", c.name, v, c.kind)
	}
	switch c.kind {
	case kindText:
		s, ok := v.(string)
		if !ok {
			return bad()
		}
		return lenPrefixed(append(buf, 'S'), []byte(s)), nil
	case kindInt:
		var n int64
		switch x := v.(type) {
		case int64:
			n = x
		case int32:
			n = int64(x)
		case int16:
			n = int64(x)
		default:
			return bad()
		}
		return binary.BigEndian.AppendUint64(append(buf, 'I'), uint64(n)), nil
	case kindFloat:
		var f float64
		switch x := v.(type) {
		case float64:
			f = x
		case float32:
			f = float64(x)
		default:
			return bad()
		}
		return binary.BigEndian.AppendUint64(append(buf, 'F'), math.Float64bits(f)), nil
	case kindBool:
		b, ok := v.(bool)
		if !ok {
			return bad()
		}
		if b {
			return append(buf, 'B', 1), nil
		}
		return append(buf, 'B', 0), nil
	case kindTime:
		t, ok := v.(time.Time)
		if !ok {
			return bad()
		}
		return binary.BigEndian.AppendUint64(append(buf, 'T'), uint64(t.UnixMicro())), nil
	case kindJSON:
		s, ok := v.(string)
		if !ok {
			return bad()
		}
		j, err := canonicalJSON([]byte(s))
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.name, err)
		}
		return lenPrefixed(append(buf, 'J'), j), nil
	case kindBytes:
		b, ok := v.([]byte)
		if !ok {
			return bad()
		}
		return lenPrefixed(append(buf, 'X'), b), nil
	}
	return bad()
}

func lenPrefixed(buf, b []byte) []byte {
	return append(binary.BigEndian.AppendUint64(buf, uint64(len(b))), b...)
}

// canonicalJSON is doc re-encoded so that SQLite's text and PostgreSQL's
// jsonb of one document agree: object keys sorted (jsonb keeps the last
// of duplicate keys, as decoding does), no insignificant space, strings
// re-escaped one way, numbers as exact rationals (jsonb writes 1e3 as
// 1000).
func canonicalJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("parse JSON: %w", err)
	}
	var out bytes.Buffer
	if err := writeCanonical(&out, v); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func writeCanonical(w *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		w.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				w.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			w.Write(kb)
			w.WriteByte(':')
			if err := writeCanonical(w, x[k]); err != nil {
				return err
			}
		}
		w.WriteByte('}')
	case []any:
		w.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				w.WriteByte(',')
			}
			if err := writeCanonical(w, e); err != nil {
				return err
			}
		}
		w.WriteByte(']')
	case json.Number:
		r, ok := new(big.Rat).SetString(string(x))
		if !ok {
			return fmt.Errorf("JSON number %s", x)
		}
		w.WriteString(r.RatString())
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return err
		}
		w.Write(b)
	}
	return nil
}

// Checksum is a table's checksum: four 64-bit lanes, each the sum (mod
// 2^64) of one quarter of every row's SHA-256, so that it does not depend
// on the order rows are read in.
type Checksum [4]uint64

// add adds one row's canonical encoding.
func (s *Checksum) add(row []byte) {
	h := sha256.Sum256(row)
	for i := range s {
		s[i] += binary.BigEndian.Uint64(h[i*8:])
	}
}

// String is the checksum in hex, 64 characters.
func (s Checksum) String() string {
	var b []byte
	for _, l := range s {
		b = binary.BigEndian.AppendUint64(b, l)
	}
	return hex.EncodeToString(b)
}
