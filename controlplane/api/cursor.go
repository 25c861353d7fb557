package api

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Sealed list cursors (docs/tenants.md, "List cursors"). A list's cursor
// is the id of the last row of the page it read (a GPU's "UUID/node", an
// event's outbox id, ...). Several lists filter the rows of the caller's
// subtree after the read, so the last row read may be another tenant's:
// handed out as is, the cursor would tell a tenant's caller another
// tenant's ids. So invoke, the one path of every call, seals the
// next_cursor of every paged answer (a request with a Page, a response
// with next_cursor) to a token of a tenant other than the root, and opens
// the page.cursor of its next request: the caller gets an opaque token it
// can only hand back, bound to the method and its tenant. A cursor that
// does not open is INVALID_ARGUMENT. A root caller sees every row, and
// gets the plain cursor as before.

// sealedCursorPrefix starts every sealed cursor (the version of its form).
const sealedCursorPrefix = "c1."

// maxSealedCursor is the longest sealed cursor accepted (its plaintext is
// at most 128 bytes, page's limit).
const maxSealedCursor = 512

// cursorKeyInfo binds the key derived from the deployment secret to this
// use (RFC 5869 §3.2).
const cursorKeyInfo = "better-compute list cursor v1"

// errCursor is the answer to a cursor that does not open.
func errCursor() *Error {
	return invalid("page.cursor", "cursor is not one this API issued")
}

// newCursorAEAD derives the cursor key from the deployment secret (every
// api process of a deployment derives the same one, so a cursor from one
// opens on another). Without a secret (tests, a store-only setup) the key
// is random: cursors then open on this process only.
func newCursorAEAD(secret string) (cipher.AEAD, error) {
	var key []byte
	if secret == "" {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("cursor key: %w", err)
		}
	} else {
		var err error
		if key, err = hkdf.Key(sha256.New, []byte(secret), nil, cursorKeyInfo, 32); err != nil {
			return nil, fmt.Errorf("cursor key: %w", err)
		}
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	return cipher.NewGCM(block)
}

// cursorAAD binds a sealed cursor to the method that issued it and the
// caller's tenant: it opens for the same method and tenant only.
func cursorAAD(name string, p *iam.Principal) []byte {
	return []byte("better-compute cursor " + name + " " + p.TenantID)
}

// sealsCursors reports whether p's cursors are sealed: a token of a tenant
// other than the root.
func sealsCursors(p *iam.Principal) bool { return within(p) != "" }

// pagedFields returns the page field of request type req and the
// next_cursor field of response type resp when the method is a paged list
// (both present), else nils.
func pagedFields(req, resp proto.Message) (page, next protoreflect.FieldDescriptor) {
	page = req.ProtoReflect().Descriptor().Fields().ByName("page")
	next = resp.ProtoReflect().Descriptor().Fields().ByName("next_cursor")
	pageType := (&apiv1.Page{}).ProtoReflect().Descriptor().FullName()
	if page == nil || page.Message() == nil || page.Message().FullName() != pageType || page.IsList() ||
		next == nil || next.Kind() != protoreflect.StringKind || next.IsList() {
		return nil, nil
	}
	return page, next
}

// sealCursor seals plain (non-empty) for p's calls of method name.
func (s *Server) sealCursor(name string, p *iam.Principal, plain string) string {
	if plain == "" {
		return ""
	}
	nonce := make([]byte, s.cursorAEAD.NonceSize(), s.cursorAEAD.NonceSize()+len(plain)+s.cursorAEAD.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic("api: read a cursor nonce: " + err.Error()) // crypto/rand does not fail
	}
	return sealedCursorPrefix + base64.RawURLEncoding.EncodeToString(s.cursorAEAD.Seal(nonce, nonce, []byte(plain), cursorAAD(name, p)))
}

// openCursor reverses sealCursor; "" opens to "".
func (s *Server) openCursor(name string, p *iam.Principal, sealed string) (string, *Error) {
	if sealed == "" {
		return "", nil
	}
	rest, ok := strings.CutPrefix(sealed, sealedCursorPrefix)
	if !ok || len(sealed) > maxSealedCursor {
		return "", errCursor()
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(b) < s.cursorAEAD.NonceSize()+s.cursorAEAD.Overhead() {
		return "", errCursor()
	}
	n := s.cursorAEAD.NonceSize()
	plain, err := s.cursorAEAD.Open(nil, b[:n], b[n:], cursorAAD(name, p))
	if err != nil {
		return "", errCursor()
	}
	return string(plain), nil
}

// openRequestCursor replaces the sealed page.cursor of req, a request of
// the paged method m, by the cursor it seals, for a caller whose cursors
// are sealed.
func (s *Server) openRequestCursor(m *method, name string, p *iam.Principal, req proto.Message) *Error {
	if m.page == nil || !sealsCursors(p) {
		return nil
	}
	r := req.ProtoReflect()
	if !r.Has(m.page) {
		return nil
	}
	pg := r.Mutable(m.page).Message()
	fd := pg.Descriptor().Fields().ByName("cursor")
	plain, e := s.openCursor(name, p, pg.Get(fd).String())
	if e != nil {
		return e
	}
	pg.Set(fd, protoreflect.ValueOfString(plain))
	return nil
}

// sealResponseCursor seals the next_cursor of resp, the answer of the
// paged method m, for a caller whose cursors are sealed.
func (s *Server) sealResponseCursor(m *method, name string, p *iam.Principal, resp proto.Message) {
	if m.next == nil || !sealsCursors(p) || resp == nil {
		return
	}
	r := resp.ProtoReflect()
	if !r.IsValid() {
		return
	}
	if plain := r.Get(m.next).String(); plain != "" {
		r.Set(m.next, protoreflect.ValueOfString(s.sealCursor(name, p, plain)))
	}
}
