package apiv1

import (
	"errors"
	"strings"
)

// MaxNameLen is the longest site, pool or region name.
const MaxNameLen = 63

// CheckName checks a site, pool or region name as sites.create and
// pools.create do: 1 to 63 characters of a-z, 0-9, '-', '_' and '.'. The
// error is the rule it breaks.
func CheckName(v string) error {
	if v == "" || len(v) > MaxNameLen {
		return errors.New("must be 1 to 63 characters")
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return errors.New("may hold only a-z, 0-9, '-', '_' and '.'")
		}
	}
	return nil
}

// CanonicalSerial spells a certificate serial as pki.FormatSerial does, the
// way revocations are stored: lower-case hex, without colons or a 0x
// prefix, leading zeros dropped and then padded to 32 digits. RFC 5280
// (4.1.2.2) makes a serial a positive number of at most 20 octets; anything
// else is an error saying so.
func CanonicalSerial(s string) (string, error) {
	hex := strings.ToLower(strings.TrimPrefix(strings.ReplaceAll(strings.TrimSpace(s), ":", ""), "0x"))
	if hex == "" || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", errors.New("not a hexadecimal certificate serial")
	}
	hex = strings.TrimLeft(hex, "0")
	if hex == "" || len(hex) > 40 {
		return "", errors.New("a certificate serial is a positive number of at most 20 octets (40 hex digits)")
	}
	if len(hex) < 32 {
		hex = strings.Repeat("0", 32-len(hex)) + hex
	}
	return hex, nil
}
