package gpu

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestXIDTableMatchesDoc keeps the table in doc.go and xidClass in step.
func TestXIDTableMatchesDoc(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^//\t +(\d+)  (.+?) +(failed|degraded)$`)
	rows := row.FindAllStringSubmatch(string(doc), -1)
	if len(rows) != 11 {
		t.Fatalf("found %d XID rows in doc.go, want 11", len(rows))
	}
	for _, r := range rows {
		xid, _ := strconv.ParseUint(r[1], 10, 64)
		h, desc := xidClass(xid)
		if string(h) != r[3] || desc != r[2] {
			t.Errorf("XID %d: code says %s %q, doc.go says %s %q", xid, h, desc, r[3], r[2])
		}
	}
	if h, _ := xidClass(999); h != HealthOK {
		t.Errorf("unknown XID: %s, want ok", h)
	}
}
