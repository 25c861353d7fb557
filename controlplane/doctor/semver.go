package doctor

import (
	"cmp"
	"strconv"
	"strings"
)

// semver is a parsed semantic version (semver.org 2.0.0).
type semver struct {
	raw                 string
	major, minor, patch uint64
	pre                 []string // dot-separated pre-release identifiers
}

// parseSemver parses MAJOR.MINOR.PATCH[-PRE][+BUILD] with an optional
// leading "v". Build metadata is ignored, as precedence ignores it.
func parseSemver(s string) (semver, bool) {
	v := semver{raw: s}
	s = strings.TrimPrefix(s, "v")
	s, _, _ = strings.Cut(s, "+")
	s, pre, hasPre := strings.Cut(s, "-")
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return semver{}, false
	}
	nums := [3]*uint64{&v.major, &v.minor, &v.patch}
	for i, p := range parts {
		if p == "" || (len(p) > 1 && p[0] == '0') {
			return semver{}, false
		}
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return semver{}, false
		}
		*nums[i] = n
	}
	if hasPre {
		v.pre = strings.Split(pre, ".")
		for _, id := range v.pre {
			if id == "" {
				return semver{}, false
			}
		}
	}
	return v, true
}

// compare returns -1, 0 or +1 as v has lower, equal or higher precedence
// than w (semver.org §11).
func (v semver) compare(w semver) int {
	if c := cmp.Compare(v.major, w.major); c != 0 {
		return c
	}
	if c := cmp.Compare(v.minor, w.minor); c != 0 {
		return c
	}
	if c := cmp.Compare(v.patch, w.patch); c != 0 {
		return c
	}
	switch {
	case len(v.pre) == 0 && len(w.pre) == 0:
		return 0
	case len(v.pre) == 0:
		return 1
	case len(w.pre) == 0:
		return -1
	}
	for i := 0; i < len(v.pre) && i < len(w.pre); i++ {
		if c := compareIdent(v.pre[i], w.pre[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(v.pre), len(w.pre))
}

// compareIdent orders pre-release identifiers: numeric ones numerically and
// below alphanumeric ones, which compare as ASCII.
func compareIdent(a, b string) int {
	na, errA := strconv.ParseUint(a, 10, 64)
	nb, errB := strconv.ParseUint(b, 10, 64)
	switch {
	case errA == nil && errB == nil:
		return cmp.Compare(na, nb)
	case errA == nil:
		return -1
	case errB == nil:
		return 1
	}
	return strings.Compare(a, b)
}
