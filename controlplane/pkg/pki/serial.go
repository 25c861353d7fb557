package pki

import (
	"crypto/rand"
	"fmt"
	"math/big"
)

// serialBits is the size of a random certificate serial: 128 bits, well
// above the 64 bits of entropy the CA/Browser Forum Baseline Requirements
// §7.1 ask for and within RFC 5280 §4.1.2.2's 20 octets.
const serialBits = 128

// newSerial returns a random positive serial number of serialBits bits.
func newSerial() (*big.Int, error) {
	var buf [serialBits / 8]byte
	for {
		if _, err := rand.Read(buf[:]); err != nil {
			return nil, fmt.Errorf("read serial: %w", err)
		}
		if n := new(big.Int).SetBytes(buf[:]); n.Sign() > 0 {
			return n, nil
		}
	}
}

// FormatSerial spells a certificate serial number the one way this project
// stores and compares it: lower-case hexadecimal, zero-padded to 32 digits
// (128 bits), longer when the number needs it. A nil serial gives "".
func FormatSerial(n *big.Int) string {
	if n == nil {
		return ""
	}
	return fmt.Sprintf("%032x", n)
}
