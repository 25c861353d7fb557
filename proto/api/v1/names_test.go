package apiv1

import (
	"strings"
	"testing"
)

// TestCheckNameIDShaped: a name shaped like an id (pool_…, site_…, ten_…)
// is refused with the rule named, so that a lookup by id or name never
// finds a row whose name is another row's id; names near that shape stay
// valid.
func TestCheckNameIDShaped(t *testing.T) {
	for _, v := range []string{
		"pool_abcdefghijklmnopqrstuvwxyz",
		"pool_234567abcdefghijklmnopqrst",
		"site_aaaaaaaaaaaaaaaaaaaaaaaaaa",
		"ten_zzzzzzzzzzzzzzzzzzzzzzzzzz",
		"x_abcdefghijklmnopqrstuvwxyz",
	} {
		err := CheckName(v)
		if err == nil || !strings.Contains(err.Error(), "shaped like an id") {
			t.Errorf("CheckName(%q) = %v, want the id-shape rule", v, err)
		}
	}
	for _, v := range []string{
		"gpu-a", "pool-a", "default", "team_a",
		"pool_abcdefghijklmnopqrstuvwxy",   // 25
		"pool_abcdefghijklmnopqrstuvwxyzz", // 27
		"pool_abcdefghijklmnopqrstuvwxy1",  // 1 is not base32
		"pool-x_abcdefghijklmnopqrstuvwxyz",
		"_abcdefghijklmnopqrstuvwxyz",
		"pool2_abcdefghijklmnopqrstuvwxyz",
	} {
		if err := CheckName(v); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", v, err)
		}
	}
}
