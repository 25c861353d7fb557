package sso

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestGroupsClaim: a groups claim is a list of strings or one string,
// bounded; anything else is refused, never guessed.
func TestGroupsClaim(t *testing.T) {
	for _, c := range []struct {
		name string
		in   any
		want []string
		err  string
	}{
		{"absent", nil, nil, ""},
		{"one string", "ops", []string{"ops"}, ""},
		{"sorted, once each", []any{"b", "a", "b"}, []string{"a", "b"}, ""},
		{"a number in it", []any{"a", 7.0}, nil, "list of strings"},
		{"an object", map[string]any{"a": 1}, nil, "want a list of strings"},
		{"too many", make([]any, MaxGroups+1), nil, "at most 1000"},
		{"too long", []any{strings.Repeat("g", MaxGroupLen+1)}, nil, "at most 256"},
	} {
		got, err := groupsOf(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}

// TestAssign: the highest role of the person's mapped groups in the one
// tenant they map to; a tenant named picks among several; none, or a
// tenant the groups give nothing in, is PERMISSION_DENIED; several without
// a name is INVALID_ARGUMENT naming them.
func TestAssign(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	for _, name := range []string{"team-a", "team-b"} {
		if _, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: name, ParentID: store.RootTenant}); err != nil {
			t.Fatal(err)
		}
	}
	s := New(Config{OIDC: config.OIDC{Groups: []config.OIDCGroup{
		{Group: "a-view", Tenant: "team-a", Role: "viewer"},
		{Group: "a-ops", Tenant: "team-a", Role: "operator"},
		{Group: "b-admin", Tenant: "team-b", Role: "admin"},
		{Group: "gone", Tenant: "no-such-tenant", Role: "admin"},
	}}}, st, nil)
	for _, c := range []struct {
		groups       []string
		tenant, want string // want: "tenant role", or the error's code
	}{
		{[]string{"a-view", "a-ops"}, "", "team-a operator"},
		{[]string{"a-ops", "a-view"}, "team-a", "team-a operator"},
		{[]string{"a-view", "b-admin"}, "team-b", "team-b admin"},
		{[]string{"a-view", "b-admin"}, "", CodeInvalid},
		{[]string{"a-view"}, "team-b", CodeDenied},
		{[]string{"other", "gone"}, "", CodeDenied},
		{nil, "", CodeDenied},
		{[]string{"a-ops"}, "no-such-tenant", CodeDenied},
	} {
		tn, role, err := s.assign(ctx, c.groups, c.tenant)
		got := ""
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("assign(%v, %q): %v", c.groups, c.tenant, err)
			}
			got = e.Code
		} else {
			got = tn.Name + " " + role
		}
		if got != c.want {
			t.Errorf("assign(%v, %q) = %s (%v), want %s", c.groups, c.tenant, got, err, c.want)
		}
	}
}
