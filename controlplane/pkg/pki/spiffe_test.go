package pki

import (
	"errors"
	"strings"
	"testing"
)

func TestNodeSPIFFEID(t *testing.T) {
	t.Parallel()
	id := NodeSPIFFEID("compute.example.com", "node-1")
	if id != "spiffe://compute.example.com/node/node-1" {
		t.Fatalf("NodeSPIFFEID = %q", id)
	}
	td, nodeID, err := ParseNodeSPIFFEID(id)
	if err != nil || td != "compute.example.com" || nodeID != "node-1" {
		t.Fatalf("ParseNodeSPIFFEID = %q, %q, %v", td, nodeID, err)
	}
	if got := InternalSPIFFEID("td", "api-1"); got != "spiffe://td/internal/api-1" {
		t.Fatalf("InternalSPIFFEID = %q", got)
	}
}

func TestParseNodeSPIFFEIDMalformed(t *testing.T) {
	t.Parallel()
	tests := map[string]error{
		"":                               nil,
		"node-1":                         nil,
		"https://td/node/n":              nil,
		"SPIFFE://td/node/n":             nil,
		"spiffe://td":                    nil,
		"spiffe://td/":                   nil,
		"spiffe://td/node/":              ErrNodeID,
		"spiffe://td/node/n/":            ErrNodeID,
		"spiffe://td/node/a/b":           ErrNodeID,
		"spiffe://td/node/N":             ErrNodeID,
		"spiffe://td/node/n%2Fx":         ErrNodeID,
		"spiffe://td/node/n?x=1":         ErrNodeID,
		"spiffe://td/node/n#f":           ErrNodeID,
		"spiffe://td/nodes/n":            nil,
		"spiffe://td/gateway/n":          nil,
		"spiffe://td//node/n":            nil,
		"spiffe://TD/node/n":             ErrTrustDomain,
		"spiffe://td:443/node/n":         ErrTrustDomain,
		"spiffe://user@td/node/n":        ErrTrustDomain,
		"spiffe:///node/n":               ErrTrustDomain,
		"spiffe://td/node/n\n":           ErrNodeID,
		" spiffe://td/node/n":            nil,
		"spiffe://td/internal/api-1":     nil,
		"spiffe://td/node/" + longNode(): ErrNodeID,
	}
	for in, part := range tests {
		_, _, err := ParseNodeSPIFFEID(in)
		if !errors.Is(err, ErrSPIFFEID) {
			t.Errorf("ParseNodeSPIFFEID(%q) = %v, want ErrSPIFFEID", in, err)
		}
		if part != nil && !errors.Is(err, part) {
			t.Errorf("ParseNodeSPIFFEID(%q) = %v, want %v", in, err, part)
		}
	}
}

func longNode() string { return strings.Repeat("a", 64) }
