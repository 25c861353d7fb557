package doctor

import "testing"

func TestSemverPrecedence(t *testing.T) {
	t.Parallel()
	// semver.org §11's example, in ascending order, and a few more.
	order := []string{"0.9.9", "v1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
		"1.0.0-beta.11", "1.0.0-rc.1", "v1.0.0+build.5", "1.0.1", "1.2.0", "1.10.0", "2.0.0"}
	for i := 1; i < len(order); i++ {
		a, okA := parseSemver(order[i-1])
		b, okB := parseSemver(order[i])
		if !okA || !okB {
			t.Fatalf("parse %q %v, %q %v", order[i-1], okA, order[i], okB)
		}
		if a.compare(b) != -1 || b.compare(a) != 1 || a.compare(a) != 0 {
			t.Errorf("%s < %s not kept", order[i-1], order[i])
		}
	}
	for _, bad := range []string{"", "dev", "1.0", "1.0.0.0", "01.0.0", "1.0.x", "1.0.0-", "1.0.0-a..b", "v"} {
		if _, ok := parseSemver(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
