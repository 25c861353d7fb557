package pki

import (
	"fmt"
	"strings"
)

// ValidateDNSName checks a DNS name for a serving certificate's SAN: at
// most 253 characters of dot-separated labels, each 1 to 63 characters of
// a-z, 0-9 and '-' not starting or ending with '-' (RFC 1123 §2.1, RFC 5280
// §4.2.1.6's preferred name syntax), lower case only, with an optional
// leading "*." wildcard label (RFC 6125 §6.4.3). Errors wrap ErrName.
func ValidateDNSName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%w: DNS name %q: want 1 to 253 characters", ErrName, name)
	}
	labels := strings.Split(strings.TrimPrefix(name, "*."), ".")
	if strings.HasPrefix(name, "*.") && len(labels) < 2 {
		return fmt.Errorf("%w: DNS name %q: a wildcard needs at least two labels under it", ErrName, name)
	}
	for _, label := range labels {
		if !validLabel(label) {
			return fmt.Errorf("%w: DNS name %q: label %q is not 1 to 63 characters of a-z, 0-9 and inner '-'", ErrName, name, label)
		}
	}
	return nil
}

func validLabel(label string) bool {
	if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
		return false
	}
	for i := range len(label) {
		c := label[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
