package apiv1

import (
	"errors"
	"strings"
)

// MaxNameLen is the longest site, pool or region name.
const MaxNameLen = 63

// CheckName checks a site, pool, tenant or region name as sites.create,
// pools.create and tenants.create do: 1 to 63 characters of a-z, 0-9, '-',
// '_' and '.', and not shaped like an id (IDShaped). The error is the rule
// it breaks.
func CheckName(v string) error {
	if v == "" || len(v) > MaxNameLen {
		return errors.New("must be 1 to 63 characters")
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return errors.New("may hold only a-z, 0-9, '-', '_' and '.'")
		}
	}
	if IDShaped(v) {
		return errors.New("must not be shaped like an id (letters, '_', then 26 of a-z and 2-7, as pool_… and site_… ids are): " +
			"a lookup by id or name would be ambiguous")
	}
	return nil
}

// idSuffixLen is the length of an id's random part (store.NewID: 26
// base32 characters, lower-cased).
const idSuffixLen = 26

// IDShaped reports whether v has the shape of an id that store.NewID makes
// (^[a-z]+_[a-z2-7]{26}$), such as pool_… or site_…: such a string is
// refused as a name, so that a name never equals another row's id.
func IDShaped(v string) bool {
	prefix, suffix, ok := strings.Cut(v, "_")
	if !ok || prefix == "" || len(suffix) != idSuffixLen {
		return false
	}
	for _, r := range prefix {
		if r < 'a' || r > 'z' {
			return false
		}
	}
	for _, r := range suffix {
		if !(r >= 'a' && r <= 'z' || r >= '2' && r <= '7') {
			return false
		}
	}
	return true
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
