package watch

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"sync"
	"time"
)

// ErrTooManySessions is returned by sessions.create when MaxSessions live
// sessions exist already.
var ErrTooManySessions = errors.New("too many page sessions: try again later")

// session is one logged-in page: the API token it was opened with (its id
// and the hash of its secret, to notice a revocation), the form token of
// its logout form, and its times.
type session struct {
	tokenID   string
	tokenHash []byte
	role      string
	// within is the path of the token's tenant when it is not the root
	// (docs/tenants.md): the session sees that subtree's part of the
	// fleet only. "" for a root token: the whole fleet.
	within string
	// tenantID and tenantPath are the token's tenant, for Config.View.
	tenantID, tenantPath string
	csrf                 string
	created              time.Time
	lastUsed             time.Time
	checked              time.Time // when the API token was last re-read
	// refresh is the refresh secret of a session opened by single sign-on
	// (the page renews the token before tokenExpires; sso.go); name is the
	// person's.
	refresh      string
	tokenExpires time.Time
	name         string
	groups       []string
}

// sessions keeps page sessions in memory, keyed by the SHA-256 of their id
// (the cookie's value), so the map holds no usable cookie. They are this
// process's own: behind a load balancer with several api processes, a
// browser must keep to one of them (docs/watch.md).
type sessions struct {
	idle, absolute time.Duration
	max            int
	now            func() time.Time

	mu sync.Mutex
	m  map[[32]byte]*session
}

func newSessions(idle, absolute time.Duration, maxSessions int, now func() time.Time) *sessions {
	return &sessions{idle: idle, absolute: absolute, max: maxSessions, now: now, m: map[[32]byte]*session{}}
}

// randomID returns 256 random bits, base64url without padding.
func randomID() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func key(id string) [32]byte { return sha256.Sum256([]byte(id)) }

// create opens a session for s and returns its id.
func (ss *sessions) create(s *session) (string, error) {
	now := ss.now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.m) >= ss.max {
		ss.pruneLocked(now)
		if len(ss.m) >= ss.max {
			return "", ErrTooManySessions
		}
	}
	id := randomID()
	s.csrf = randomID()
	s.created, s.lastUsed, s.checked = now, now, now
	ss.m[key(id)] = s
	return id, nil
}

// get returns the live session with id and marks it used; nil when there is
// none, or it passed its idle or absolute lifetime (then it is removed).
func (ss *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	now := ss.now()
	k := key(id)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[k]
	if s == nil {
		return nil
	}
	if ss.expired(s, now) {
		delete(ss.m, k)
		return nil
	}
	s.lastUsed = now
	c := *s
	return &c
}

// live reports whether id names a live session, without marking it used:
// an open event stream does not keep an idle page alive by itself.
func (ss *sessions) live(id string) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[key(id)]
	return s != nil && !ss.expired(s, ss.now())
}

// markChecked records that the session's API token was re-read at now.
func (ss *sessions) markChecked(id string, now time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s := ss.m[key(id)]; s != nil {
		s.checked = now
	}
}

// peek returns a copy of the live session with id without marking it
// used; nil when there is none.
func (ss *sessions) peek(id string) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[key(id)]
	if s == nil || ss.expired(s, ss.now()) {
		return nil
	}
	c := *s
	return &c
}

// update changes the session with id under the lock.
func (ss *sessions) update(id string, fn func(*session)) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s := ss.m[key(id)]; s != nil {
		fn(s)
	}
}

// end removes a session; ending one that does not exist is a no-op.
func (ss *sessions) end(id string) {
	ss.mu.Lock()
	delete(ss.m, key(id))
	ss.mu.Unlock()
}

func (ss *sessions) expired(s *session, now time.Time) bool {
	return !now.Before(s.lastUsed.Add(ss.idle)) || !now.Before(s.created.Add(ss.absolute))
}

func (ss *sessions) pruneLocked(now time.Time) {
	for k, s := range ss.m {
		if ss.expired(s, now) {
			delete(ss.m, k)
		}
	}
}
