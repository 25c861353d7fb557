package api_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestInFlightPerToken: a token with InFlightPerToken calls in flight (here
// one, held by a body still arriving) is refused RESOURCE_EXHAUSTED, 429
// with Retry-After; another token is served meanwhile, and the place comes
// back when the call ends.
func TestInFlightPerToken(t *testing.T) {
	f := newFixture(t)
	f.srv = api.New(api.Config{Secret: strings.Repeat("s", 32), InFlightPerToken: 1}, f.st, nil)
	other := f.token(store.RoleViewer, 0)

	body, send := io.Pipe()
	r := httptest.NewRequest(http.MethodPost, "/api/sites/list", body)
	r.RemoteAddr = peer
	r.Header.Set("X-Better-Compute", "1")
	r.Header.Set("Authorization", "Bearer "+f.admin)
	held := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.srv.Handler().ServeHTTP(held, r)
	}()
	// The call is in flight once it reads its body.
	if _, err := send.Write([]byte("{")); err != nil {
		t.Fatal(err)
	}

	rr := httptest.NewRequest(http.MethodPost, "/api/sites/list", strings.NewReader("{}"))
	rr.RemoteAddr = peer
	rr.Header.Set("X-Better-Compute", "1")
	rr.Header.Set("Authorization", "Bearer "+f.admin)
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, rr)
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), apiv1.CodeResourceExhausted) || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("a second call in flight: %d %s Retry-After %q, want 429 RESOURCE_EXHAUSTED Retry-After 1", w.Code, w.Body.String(), w.Header().Get("Retry-After"))
	}
	if res := f.call("sites.list", other, "{}", peer); res.Code != http.StatusOK {
		t.Fatalf("another token meanwhile: %v", res)
	}

	_, _ = send.Write([]byte("}"))
	send.Close()
	<-done
	if held.Code != http.StatusOK {
		t.Fatalf("the held call: %d %s", held.Code, held.Body.String())
	}
	if res := f.call("sites.list", f.admin, "{}", peer); res.Code != http.StatusOK {
		t.Fatalf("after the held call ended: %v", res)
	}
}

// TestStringBounds: an id over 128 bytes and a description over 1 KiB are
// refused INVALID_ARGUMENT naming the field; 1 KiB exactly is taken.
func TestStringBounds(t *testing.T) {
	f := newFixture(t)
	wantCode(t, f.call("nodes.get", f.admin, `{"id":"`+strings.Repeat("n", api.MaxIDBytes+1)+`"}`, peer), 400, apiv1.CodeInvalidArgument, "id")
	wantCode(t, f.call("tokens.create", f.admin, `{"role":"viewer","description":"`+strings.Repeat("d", api.MaxNoteBytes+1)+`"}`, peer),
		400, apiv1.CodeInvalidArgument, "description")
	if res := f.call("tokens.create", f.admin, `{"role":"viewer","description":"`+strings.Repeat("d", api.MaxNoteBytes)+`"}`, peer); res.Code != http.StatusOK {
		t.Fatalf("a 1 KiB description: %v", res)
	}
}
