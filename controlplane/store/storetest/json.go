package storetest

import (
	"encoding/json"
	"reflect"
	"testing"
)

// jsonEqual compares two JSON documents by value: PostgreSQL's jsonb
// normalises spacing and key order.
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("decode %q: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}
