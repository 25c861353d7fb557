package api

import (
	"strings"
	"testing"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestMethodsMatchProto checks that the server's handlers are exactly
// api.proto's rpcs, with the proto's roles and audit flags, and that a
// mismatch either way fails New.
func TestMethodsMatchProto(t *testing.T) {
	t.Parallel()
	s := New(Config{}, nil, nil) // panics on a mismatch
	if len(s.methods) != len(apiv1.Methods) {
		t.Fatalf("%d handlers, %d rpcs", len(s.methods), len(apiv1.Methods))
	}
	for _, spec := range apiv1.Methods {
		m := s.methods[spec.Name]
		if m == nil {
			t.Fatalf("%s: no handler", spec.Name)
		}
		if m.role != spec.Role || m.mutating != spec.Mutating {
			t.Errorf("%s: role %s mutating %v, api.proto says %s %v", spec.Name, m.role, m.mutating, spec.Role, spec.Mutating)
		}
		if got := m.newReq().ProtoReflect().Descriptor(); got != spec.Request.ProtoReflect().Descriptor() {
			t.Errorf("%s: request %s, api.proto says %s", spec.Name, got.FullName(), spec.Request.ProtoReflect().Descriptor().FullName())
		}
	}

	// bind registers the real handlers against table and returns what
	// checkMethods says.
	bind := func(table []apiv1.Method) error {
		s := &Server{methods: map[string]*method{}, table: map[string]apiv1.Method{}}
		for _, m := range table {
			s.table[m.Name] = m
		}
		s.registerMethods()
		return s.checkMethods()
	}
	if err := bind(apiv1.Methods); err != nil {
		t.Fatalf("the real table: %v", err)
	}
	var without, extra, wrongType []apiv1.Method
	for _, m := range apiv1.Methods {
		switch m.Name {
		case "nodes.get":
			continue // a handler with no rpc
		case "sites.list":
			m.Response = (*apiv1.ListPoolsResponse)(nil) // a handler of another type
			wrongType = append(wrongType, m)
			continue
		}
		without = append(without, m)
		wrongType = append(wrongType, m)
	}
	wrongType = append(wrongType, apiv1.Method{Name: "nodes.get", Role: "viewer",
		Request: (*apiv1.NodeRequest)(nil), Response: (*apiv1.NodeResponse)(nil)})
	extra = append(append(extra, apiv1.Methods...), apiv1.Method{Name: "nodes.teleport", Role: "admin", Mutating: true,
		Request: (*apiv1.NodeRequest)(nil), Response: (*apiv1.NodeResponse)(nil)})
	for _, tc := range []struct {
		name  string
		table []apiv1.Method
		want  string
	}{
		{"handler without rpc", without, "handler nodes.get: no rpc in api.proto's services"},
		{"rpc without handler", extra, "rpc nodes.teleport of api.proto has no handler"},
		{"other types", wrongType, "handler sites.list: takes *apiv1.ListSitesRequest and returns *apiv1.ListSitesResponse, api.proto says *apiv1.ListSitesRequest and *apiv1.ListPoolsResponse"},
	} {
		err := bind(tc.table)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}
