package api

import (
	"testing"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestEveryListCursorSealed: every method of api.proto whose answer holds
// a next_cursor pages with a Page, so invoke seals its cursors to a
// tenant's caller (cursor.go); a list added without one fails here. The
// exceptions page by something that is no row's id.
func TestEveryListCursorSealed(t *testing.T) {
	notRows := map[string]bool{
		"recordings.get": true, // the sequence number of a recording's chunk
	}
	paged := 0
	for _, m := range apiv1.Methods {
		page, _ := pagedFields(m.Request, m.Response)
		has := m.Response.ProtoReflect().Descriptor().Fields().ByName("next_cursor") != nil
		switch {
		case page != nil:
			paged++
		case has && !notRows[m.Name]:
			t.Errorf("%s answers a next_cursor but its request has no page: its cursor would not be sealed", m.Name)
		}
	}
	for _, name := range []string{"gpus.list", "rollouts.list", "remediation.list", "recordings.list", "reservations.list",
		"events.list", "sinks.deadLetters", "nodes.list", "audit.list"} {
		found := false
		for _, m := range apiv1.Methods {
			if m.Name == name {
				p, _ := pagedFields(m.Request, m.Response)
				found = p != nil
			}
		}
		if !found {
			t.Errorf("%s is not a paged list", name)
		}
	}
	if paged == 0 {
		t.Fatal("no paged list")
	}
}
