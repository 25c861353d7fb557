package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/store"
)

// TestTokenExpiry: live API tokens within 7 days of their end warn; a
// long-lived one within a day fails; one made short on purpose only warns;
// revoked, expired and never-ending tokens are not judged. The clock is
// injected: the tokens live days, the test runs in milliseconds.
func TestTokenExpiry(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, st rawStore) {
		ctx := context.Background()
		now := time.Now().UTC()
		want(t, doctor.TokenExpiry(ctx, st, now), doctor.IDTokenExpiry, doctor.OK, "no live API token has an expiry")
		mk := func(id string, life time.Duration) {
			t.Helper()
			var exp *time.Time
			if life != 0 {
				e := now.Add(life)
				exp = &e
			}
			if err := st.APITokenCreate(ctx, &store.APIToken{ID: id, Role: store.RoleOperator, ExpiresAt: exp}, []byte(id)); err != nil {
				t.Fatal(err)
			}
		}
		day := 24 * time.Hour
		mk("tok_forever", 0)
		mk("tok_ci", 30*day)    // long-lived
		mk("tok_script", 2*day) // short on purpose
		mk("tok_revoked", 30*day)
		if err := st.APITokenRevoke(ctx, "tok_revoked"); err != nil {
			t.Fatal(err)
		}
		// The script's token is within the week from the start: warn.
		r := doctor.TokenExpiry(ctx, st, now)
		want(t, r, doctor.IDTokenExpiry, doctor.Warn, "1 API token(s) end within 7 days")
		if !strings.Contains(r.Detail, "tok_script") {
			t.Fatalf("detail %q does not name tok_script", r.Detail)
		}
		// Ten days in, past its end, nothing is within the week.
		want(t, doctor.TokenExpiry(ctx, st, now.Add(10*day)), doctor.IDTokenExpiry, doctor.OK, "no API token ends within 7 days")
		// Past the script's end, 25 days in: the CI token is within the week.
		r = doctor.TokenExpiry(ctx, st, now.Add(25*day))
		want(t, r, doctor.IDTokenExpiry, doctor.Warn, "1 API token(s) end within 7 days")
		if !strings.Contains(r.Detail, "tok_ci") {
			t.Fatalf("detail %q does not name tok_ci", r.Detail)
		}
		// Within its last day the long-lived token fails.
		r = doctor.TokenExpiry(ctx, st, now.Add(29*day+12*time.Hour))
		want(t, r, doctor.IDTokenExpiry, doctor.Fail, "long-lived API token(s) end within 24h")
		// The short one in its last day still only warns.
		want(t, doctor.TokenExpiry(ctx, st, now.Add(day+12*time.Hour)), doctor.IDTokenExpiry, doctor.Warn, "end within 7 days")
	})
}
