package pki

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateDNSName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"localhost", "gw.example.com", "*.gw.example.com", "a-b.c0", strings.Repeat("a", 63) + ".com"} {
		if err := ValidateDNSName(name); err != nil {
			t.Errorf("ValidateDNSName(%q): %v", name, err)
		}
	}
	for _, name := range []string{
		"", "GW.example.com", "*.com", "*", "a.*.com", "gw..example.com", ".gw.example.com", "gw.example.com.",
		"-gw.example.com", "gw-.example.com", "gw example.com", "gw_1.example.com", "10.0.0.1:443",
		strings.Repeat("a", 64) + ".com", strings.Repeat("a.", 127) + "aa",
	} {
		if err := ValidateDNSName(name); !errors.Is(err, ErrName) {
			t.Errorf("ValidateDNSName(%q) = %v, want ErrName", name, err)
		}
	}
}
