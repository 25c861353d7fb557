package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testOIDCSessions: a sign-in in progress is read and finished once; a
// session's refresh secret works once (a second refresh with it is a
// conflict), its token carries the person; a refresh that changes the
// person's rights revokes the earlier tokens; ending a session revokes
// every token of it.
func testOIDCSessions(ctx context.Context, t *testing.T, h *Harness) {
	now := time.Now().UTC().Truncate(time.Second)
	login := &store.OIDCLogin{Kind: "device", DeviceCode: "dc", Interval: 5, CreatedAt: now, ExpiresAt: now.Add(10 * time.Minute)}
	if err := h.Store.OIDCLoginPut(ctx, []byte("login-1"), login); err != nil {
		t.Fatal(err)
	}
	got := must(h.Store.OIDCLoginGet(ctx, []byte("login-1")))
	if got.DeviceCode != "dc" || got.Interval != 5 || !got.ExpiresAt.Equal(login.ExpiresAt) {
		t.Fatalf("login read back = %+v", got)
	}
	if err := h.Store.OIDCLoginDelete(ctx, []byte("login-1")); err != nil {
		t.Fatal(err)
	}
	wantErr(t, h.Store.OIDCLoginDelete(ctx, []byte("login-1")), store.ErrNotFound)

	sess := &store.OIDCSession{ID: store.NewID("ses"), Subject: "http://idp#alice", DisplayName: "alice@example.test",
		TenantID: store.RootTenant, Role: store.RoleOperator, Groups: []string{"gpu", "ops"}, Client: "cli",
		ProviderRefresh: "rt-1", CreatedAt: now, RefreshedAt: now, ExpiresAt: now.Add(time.Hour)}
	exp := now.Add(time.Minute)
	tok1 := &store.APIToken{ID: store.NewID("tok"), Role: store.RoleOperator, TenantID: store.RootTenant, ExpiresAt: &exp}
	if err := h.Store.OIDCSessionStart(ctx, sess, []byte("refresh-1"), tok1, []byte("secret-1")); err != nil {
		t.Fatal(err)
	}
	t1 := must(h.Store.APITokenBySecret(ctx, []byte("secret-1")))
	if t1.SessionID != sess.ID || t1.Subject != sess.Subject || !slices.Equal(t1.Groups, sess.Groups) || t1.DisplayName != "alice@example.test" {
		t.Fatalf("the session's token = %+v", t1)
	}
	if got := must(h.Store.OIDCSessionByRefresh(ctx, []byte("refresh-1"))); got.ID != sess.ID || got.ProviderRefresh != "rt-1" || !got.Live(now) {
		t.Fatalf("session by refresh secret = %+v", got)
	}

	sess.Groups, sess.ProviderRefresh, sess.RefreshedAt = []string{"gpu"}, "rt-2", now.Add(time.Minute)
	tok2 := &store.APIToken{ID: store.NewID("tok"), Role: store.RoleOperator, TenantID: store.RootTenant, ExpiresAt: &exp}
	if err := h.Store.OIDCSessionRefresh(ctx, sess, []byte("refresh-1"), []byte("refresh-2"), tok2, []byte("secret-2"), true); err != nil {
		t.Fatal(err)
	}
	tok3 := &store.APIToken{ID: store.NewID("tok"), Role: store.RoleOperator, TenantID: store.RootTenant, ExpiresAt: &exp}
	wantErr(t, h.Store.OIDCSessionRefresh(ctx, sess, []byte("refresh-1"), []byte("refresh-3"), tok3, []byte("secret-3"), false), store.ErrConflict)
	_, err := h.Store.OIDCSessionByRefresh(ctx, []byte("refresh-1"))
	wantErr(t, err, store.ErrNotFound)
	if t1 := must(h.Store.APITokenBySecret(ctx, []byte("secret-1"))); t1.RevokedAt == nil {
		t.Fatal("a refresh that changed the groups left the earlier token live")
	}
	if t2 := must(h.Store.APITokenBySecret(ctx, []byte("secret-2"))); t2.RevokedAt != nil || !slices.Equal(t2.Groups, []string{"gpu"}) {
		t.Fatalf("the refreshed token = %+v", t2)
	}

	again := *sess
	again.ProviderRefresh, again.RefreshedAt = "rt-3", now.Add(2*time.Minute)
	if err := h.Store.OIDCSessionRevalidated(ctx, &again, "rt-2", false); err != nil {
		t.Fatal(err)
	}
	wantErr(t, h.Store.OIDCSessionRevalidated(ctx, &again, "rt-2", false), store.ErrConflict)
	if got := must(h.Store.OIDCSessionGet(ctx, sess.ID)); got.ProviderRefresh != "rt-3" || !got.RefreshedAt.Equal(again.RefreshedAt) {
		t.Fatalf("after the control plane's own refresh the session = %+v", got)
	}
	if err := h.Store.OIDCSessionEnd(ctx, sess.ID, "signed out"); err != nil {
		t.Fatal(err)
	}
	if err := h.Store.OIDCSessionEnd(ctx, sess.ID, "again"); err != nil {
		t.Fatalf("ending an ended session: %v", err)
	}
	wantErr(t, h.Store.OIDCSessionEnd(ctx, "ses_none", "x"), store.ErrNotFound)
	if byRefresh := must(h.Store.OIDCSessionByRefresh(ctx, []byte("refresh-2"))); byRefresh.EndedAt == nil {
		t.Fatal("an ended session's refresh secret finds it live")
	}
	ended := must(h.Store.OIDCSessionGet(ctx, sess.ID))
	if ended.Live(now) || ended.EndReason != "signed out" {
		t.Fatalf("ended session = %+v", ended)
	}
	if t2 := must(h.Store.APITokenBySecret(ctx, []byte("secret-2"))); t2.RevokedAt == nil {
		t.Fatal("ending the session left its token live")
	}
	if n := must(h.Store.OIDCLoginsPrune(ctx, time.Now().Add(48*time.Hour))); n < 1 {
		t.Fatalf("prune removed %d rows, want the ended session at least", n)
	}
}
