package pki

import (
	"fmt"
	"regexp"
	"strings"
)

// MaxTrustDomainLen is the longest trust domain name the SPIFFE ID
// specification (§2.1) allows, in bytes.
const MaxTrustDomainLen = 255

// NodeIDPattern is the form of a node id: a lower-case letter or digit, then
// up to 62 lower-case letters, digits, '_' or '-' (1 to 63 characters). It
// fits in a DNS label's length and a SPIFFE path segment without escaping.
const NodeIDPattern = `^[a-z0-9][a-z0-9_-]{0,62}$`

const (
	spiffeScheme   = "spiffe://"
	nodePathPrefix = "/node/"
	internalPath   = "/internal/"
)

// nodeIDRegexp matches valid node ids and internal names; see
// NodeIDPattern.
var nodeIDRegexp = regexp.MustCompile(NodeIDPattern)

// ValidateTrustDomain checks td against the SPIFFE ID specification §2.1: 1
// to MaxTrustDomainLen characters, each a lower-case letter, digit, '.', '-'
// or '_'. A scheme, port, path or upper case is refused, with a hint. Errors
// wrap ErrTrustDomain.
func ValidateTrustDomain(td string) error {
	switch {
	case td == "":
		return fmt.Errorf("%w: empty", ErrTrustDomain)
	case len(td) > MaxTrustDomainLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrTrustDomain, len(td), MaxTrustDomainLen)
	case strings.Contains(td, "://"):
		return fmt.Errorf("%w: %q has a scheme; give the bare name, as in example.org", ErrTrustDomain, td)
	case strings.Contains(td, "/"):
		return fmt.Errorf("%w: %q has a path", ErrTrustDomain, td)
	case strings.Contains(td, ":"):
		return fmt.Errorf("%w: %q has a port", ErrTrustDomain, td)
	}
	for _, r := range td {
		if !isTrustDomainChar(r) {
			return fmt.Errorf("%w: %q has %q; allowed are a-z, 0-9, '.', '-' and '_'", ErrTrustDomain, td, r)
		}
	}
	return nil
}

func isTrustDomainChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_'
}

// ValidateNodeID checks id against NodeIDPattern. Errors wrap ErrNodeID.
func ValidateNodeID(id string) error {
	if !nodeIDRegexp.MatchString(id) {
		return fmt.Errorf("%w: %q does not match %s", ErrNodeID, id, NodeIDPattern)
	}
	return nil
}

// NodeSPIFFEID returns the SPIFFE ID of a node,
// "spiffe://<td>/node/<nodeID>". It does not validate its arguments; the
// issuing and verifying functions do.
func NodeSPIFFEID(td, nodeID string) string {
	return spiffeScheme + td + nodePathPrefix + nodeID
}

// ParseNodeSPIFFEID splits a node SPIFFE ID into its trust domain and node
// id. It accepts only the exact form NodeSPIFFEID makes, with a valid trust
// domain and node id: no port, user, query, fragment, percent-encoding or
// other path. Errors wrap ErrSPIFFEID and, where one part is at fault,
// ErrTrustDomain or ErrNodeID.
func ParseNodeSPIFFEID(uri string) (td, nodeID string, err error) {
	rest, ok := strings.CutPrefix(uri, spiffeScheme)
	if !ok {
		return "", "", fmt.Errorf("%w: %q does not start with %q", ErrSPIFFEID, uri, spiffeScheme)
	}
	slash := strings.IndexByte(rest, '/')
	if slash < 0 {
		return "", "", fmt.Errorf("%w: %q has no path", ErrSPIFFEID, uri)
	}
	td, path := rest[:slash], rest[slash:]
	if err := ValidateTrustDomain(td); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrSPIFFEID, err)
	}
	nodeID, ok = strings.CutPrefix(path, nodePathPrefix)
	if !ok {
		return "", "", fmt.Errorf("%w: %q: path is not %s<node-id>", ErrSPIFFEID, uri, nodePathPrefix)
	}
	if err := ValidateNodeID(nodeID); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrSPIFFEID, err)
	}
	return td, nodeID, nil
}

// InternalSPIFFEID returns the SPIFFE ID that IssueInternal gives a
// control-plane process, "spiffe://<td>/internal/<name>".
func InternalSPIFFEID(td, name string) string {
	return spiffeScheme + td + internalPath + name
}
