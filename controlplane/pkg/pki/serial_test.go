package pki

import (
	"math/big"
	"testing"
)

func TestFormatSerial(t *testing.T) {
	t.Parallel()
	tests := map[string]*big.Int{
		"":                                  nil,
		"00000000000000000000000000000001":  big.NewInt(1),
		"000000000000000000000000000000ff":  big.NewInt(255),
		"ffffffffffffffffffffffffffffffff":  new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 128), big.NewInt(1)),
		"100000000000000000000000000000000": new(big.Int).Lsh(big.NewInt(1), 128),
	}
	for want, n := range tests {
		if got := FormatSerial(n); got != want {
			t.Errorf("FormatSerial(%v) = %q, want %q", n, got, want)
		}
	}
}
