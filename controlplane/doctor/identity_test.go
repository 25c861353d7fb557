package doctor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/store"
)

func TestClockSkew(t *testing.T) {
	t.Parallel()
	skew := func(id string, d time.Duration) *store.Node { return &store.Node{ID: id, ClockSkew: &d} }

	want(t, doctor.ClockSkew(nil), doctor.IDClockSkew, doctor.OK, "no node clock skew measured yet")
	want(t, doctor.ClockSkew([]*store.Node{{ID: "unmeasured"}}), doctor.IDClockSkew, doctor.OK, "measured yet")

	// Within 30 s either way, 30 s itself included: ok, naming the largest.
	fine := []*store.Node{skew("a", 2*time.Second), skew("b", -doctor.ClockSkewWarn), {ID: "c"}, skew("d", 0)}
	r := doctor.ClockSkew(fine)
	want(t, r, doctor.IDClockSkew, doctor.OK, "every node clock within 30s")
	if r.Detail != "3 node(s) measured; the largest skew 30 s behind (b)" {
		t.Fatalf("detail %q", r.Detail)
	}

	// Over 30 s: warn, the worst first with seconds and direction.
	bad := append(fine, skew("e", 45*time.Second), skew("f", -2*time.Minute), skew("g", 31*time.Second))
	r = doctor.ClockSkew(bad)
	want(t, r, doctor.IDClockSkew, doctor.Warn, "3 node clock(s) more than 30s off")
	if r.Detail != "f 120 s behind, e 45 s ahead, g 31 s ahead" {
		t.Fatalf("detail %q", r.Detail)
	}

	// Many: the worst five, then how many more.
	var many []*store.Node
	for i := range 8 {
		many = append(many, skew(fmt.Sprintf("n%d", i), time.Duration(i+1)*time.Minute))
	}
	r = doctor.ClockSkew(many)
	want(t, r, doctor.IDClockSkew, doctor.Warn, "8 node clock(s)")
	if r.Detail != "n7 480 s ahead, n6 420 s ahead, n5 360 s ahead, n4 300 s ahead, n3 240 s ahead, and 3 more" {
		t.Fatalf("detail %q", r.Detail)
	}
}

// failingDuplicates is a store whose NodeHostnameDuplicates fails.
type failingDuplicates struct{}

func (failingDuplicates) NodeHostnameDuplicates(context.Context, int) ([]*store.HostnameDuplicate, error) {
	return nil, errors.New("database is gone")
}

func TestDuplicateHostnames(t *testing.T) {
	t.Parallel()
	want(t, doctor.DuplicateHostnames(context.Background(), failingDuplicates{}), doctor.IDDuplicateHostnames, doctor.Fail, "database is gone")
	each(t, func(t *testing.T, st rawStore) {
		ctx := context.Background()
		f := newFleet(t, st)
		add := func(id, hostname string) {
			t.Helper()
			if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: f.pool, Hostname: hostname, MachineID: id}); err != nil {
				t.Fatal(err)
			}
		}
		add("node-a", "gpu-01")
		add("node-b", "gpu-02")
		want(t, doctor.DuplicateHostnames(ctx, st), doctor.IDDuplicateHostnames, doctor.OK, "no two nodes share a hostname")

		// A reinstall joined with a plain token, and a clone.
		add("node-c", "gpu-01")
		add("node-d", "gpu-02")
		add("node-e", "gpu-02")
		r := doctor.DuplicateHostnames(ctx, st)
		want(t, r, doctor.IDDuplicateHostnames, doctor.Warn, "2 hostname(s) shared by several nodes")
		if !strings.Contains(r.Hint, "better-compute nodes reinstall NODE") {
			t.Fatalf("hint %q does not name the reinstall path", r.Hint)
		}
		if r.Detail != "gpu-01: node-a, node-c; gpu-02: node-b, node-d, node-e" {
			t.Fatalf("detail %q", r.Detail)
		}

		// At the listing limit the count says there may be more.
		for i := range doctor.DuplicateHostnamesListed {
			add(fmt.Sprintf("node-x%d", i), fmt.Sprintf("host-%02d", i))
			add(fmt.Sprintf("node-y%d", i), fmt.Sprintf("host-%02d", i))
		}
		r = doctor.DuplicateHostnames(ctx, st)
		want(t, r, doctor.IDDuplicateHostnames, doctor.Warn, fmt.Sprintf("%d or more hostnames", doctor.DuplicateHostnamesListed))

		// Run reports both, after the other fleet checks.
		if err := st.NodeSetClockSkew(ctx, "node-a", -90*time.Second, nil); err != nil {
			t.Fatal(err)
		}
		rep := doctor.Run(ctx, st, doctor.Config{Secret: secret})
		n := len(rep.Checks)
		if n < 2 || rep.Checks[n-2].ID != doctor.IDClockSkew || rep.Checks[n-1].ID != doctor.IDDuplicateHostnames {
			t.Fatalf("checks = %+v", rep.Checks)
		}
		want(t, rep.Checks[n-2], doctor.IDClockSkew, doctor.Warn, "1 node clock(s)")
		if rep.Checks[n-2].Detail != "node-a 90 s behind" {
			t.Fatalf("clock-skew detail %q", rep.Checks[n-2].Detail)
		}
		want(t, rep.Checks[n-1], doctor.IDDuplicateHostnames, doctor.Warn, "shared by several nodes")
	})
}
