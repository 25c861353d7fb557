package api_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestReservationRefusals: bad reservations.* and capacity.summary input
// is INVALID_ARGUMENT naming the field, an unknown pool or reservation
// NOT_FOUND, a closed reservation CONFLICT; never a 500.
func TestReservationRefusals(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu", SiteID: site.ID}); err != nil {
		t.Fatal(err)
	}
	op := f.token(store.RoleOperator, 0)
	end := time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		method, body string
		status       int
		code, field  string
	}{
		{"reservations.create", `{"pool":"gpu","owner":"o","end":"` + end + `"}`, 400, apiv1.CodeInvalidArgument, "gpus"},
		{"reservations.create", `{"pool":"gpu","gpus":1,"nodes":1,"owner":"o","end":"` + end + `"}`, 400, apiv1.CodeInvalidArgument, "gpus"},
		{"reservations.create", `{"pool":"gpu","gpus":-1,"owner":"o","end":"` + end + `"}`, 400, apiv1.CodeInvalidArgument, "gpus"},
		{"reservations.create", `{"pool":"gpu","gpus":5000,"owner":"o","end":"` + end + `"}`, 400, apiv1.CodeInvalidArgument, "gpus"},
		{"reservations.create", `{"pool":"gpu","gpus":1,"end":"` + end + `"}`, 400, apiv1.CodeInvalidArgument, "owner"},
		{"reservations.create", `{"pool":"gpu","gpus":1,"owner":"o"}`, 400, apiv1.CodeInvalidArgument, "end"},
		{"reservations.create", `{"pool":"gpu","gpus":1,"owner":"o","end":"` + past + `"}`, 400, apiv1.CodeInvalidArgument, "end"},
		{"reservations.create", `{"pool":"gpu","gpus":1,"owner":"o","start":"2030-01-01T00:00:00Z","end":"2029-01-01T00:00:00Z"}`, 400, apiv1.CodeInvalidArgument, "end"},
		{"reservations.create", `{"pool":"gpu","gpus":1,"owner":"o","end":"2099-01-01T00:00:00Z"}`, 400, apiv1.CodeInvalidArgument, "end"},
		{"reservations.create", `{"pool":"gpu","gpus":1,"owner":"o","end":"` + end + `","minGpuMemoryMib":"-5"}`, 400, apiv1.CodeInvalidArgument, "minGpuMemoryMib"},
		{"reservations.create", `{"pool":"gpu","gpus":1,"owner":"o","end":"not a time"}`, 400, apiv1.CodeInvalidArgument, ""},
		{"reservations.create", `{"pool":"nope","gpus":1,"owner":"o","end":"` + end + `"}`, 404, apiv1.CodeNotFound, "pool"},
		{"reservations.create", `{"gpus":1,"owner":"o","end":"` + end + `"}`, 400, apiv1.CodeInvalidArgument, "pool"},
		{"reservations.get", `{"id":"res_nope"}`, 404, apiv1.CodeNotFound, "id"},
		{"reservations.get", `{}`, 400, apiv1.CodeInvalidArgument, "id"},
		{"reservations.list", `{"state":"bogus"}`, 400, apiv1.CodeInvalidArgument, "state"},
		{"reservations.list", `{"pool":"nope"}`, 404, apiv1.CodeNotFound, "pool"},
		{"reservations.cancel", `{"id":"res_nope"}`, 404, apiv1.CodeNotFound, "id"},
		{"reservations.extend", `{"id":"res_nope","end":"` + end + `"}`, 404, apiv1.CodeNotFound, "id"},
		{"reservations.extend", `{"id":"res_nope"}`, 400, apiv1.CodeInvalidArgument, "end"},
		{"capacity.summary", `{"from":"` + end + `"}`, 400, apiv1.CodeInvalidArgument, "from"},
		{"capacity.summary", `{"at":"` + end + `","from":"` + end + `","to":"` + end + `"}`, 400, apiv1.CodeInvalidArgument, "at"},
		{"capacity.summary", `{"from":"` + end + `","to":"` + past + `"}`, 400, apiv1.CodeInvalidArgument, "to"},
		{"capacity.summary", `{"pool":"nope"}`, 404, apiv1.CodeNotFound, "pool"},
	} {
		t.Run(fmt.Sprintf("%s %s", c.method, c.body), func(t *testing.T) {
			wantCode(t, f.call(c.method, op, c.body, peer), c.status, c.code, c.field)
		})
	}
	// A good one, then cancelled twice: the second is CONFLICT; extending
	// it too.
	r := f.call("reservations.create", op, `{"pool":"gpu","gpus":2,"owner":"team","end":"`+end+`"}`, peer)
	if r.Code != 200 || r.Body["state"] != store.ReservationPending {
		t.Fatalf("create: %d %v", r.Code, r.Body)
	}
	id := r.Body["id"].(string)
	if r := f.call("reservations.cancel", op, `{"id":"`+id+`","reason":"no longer needed"}`, peer); r.Code != 200 || r.Body["state"] != store.ReservationCancelled {
		t.Fatalf("cancel: %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("reservations.cancel", op, `{"id":"`+id+`"}`, peer), 409, apiv1.CodeConflict, "id")
	wantCode(t, f.call("reservations.extend", op, `{"id":"`+id+`","end":"2030-01-01T00:00:00Z"}`, peer), 409, apiv1.CodeConflict, "id")
	// A viewer reads but does not create.
	viewer := f.token(store.RoleViewer, 0)
	wantCode(t, f.call("reservations.create", viewer, `{"pool":"gpu","gpus":2,"owner":"team","end":"`+end+`"}`, peer), 403, apiv1.CodePermissionDenied, "")
	if r := f.call("capacity.summary", viewer, `{"pool":"gpu"}`, peer); r.Code != 200 {
		t.Fatalf("capacity.summary: %d %v", r.Code, r.Body)
	}
}
