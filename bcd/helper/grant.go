package helper

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// OpGrant asks the helper for a grant: the right to start one root process
// (OpExec, or a root shell, OpShell) for one command or tunnel id. The
// answer's Frame carries the grant in Grant. bcd asks for it right before it
// asks for the root process, and only for a command or tunnel the control
// plane sent as root (docs/bcd.md, "What a command can touch").
const OpGrant = "grant"

// Grant bounds (issue 27: an asRoot command reaches root only through a
// grant bound to its id, which the helper checks).
const (
	// GrantTTL is how long a grant can be used after it was made.
	GrantTTL = 30 * time.Second
	// MaxGrants is how many unused grants the helper keeps; past it a new
	// grant is refused until some are used or expire.
	MaxGrants = 1024
	// MaxIDLen is the longest command or tunnel id a grant is bound to.
	MaxIDLen = 128
)

// GrantRequest is the call of OpGrant.
type GrantRequest struct {
	// ID is the command id (exec) or tunnel id (shell) the grant is for.
	ID string `json:"id"`
}

// Errors of the grant checks, in the refusal's text.
var (
	errNoGrant      = errors.New("a root process needs a grant bound to its command id (op grant)")
	errUnknownGrant = errors.New("unknown, used or expired grant")
	errGrantID      = errors.New("grant was made for another command id")
	errTooManyGrant = fmt.Errorf("too many unused grants (at most %d)", MaxGrants)
)

// grants holds the unused grants: each token is bound to one id, used once,
// and expires after GrantTTL.
type grants struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[string]grant // by token
}

type grant struct {
	id      string
	expires time.Time
}

func newGrants(now func() time.Time) *grants {
	return &grants{now: now, m: map[string]grant{}}
}

// issue makes a grant for id and returns its token.
func (g *grants) issue(id string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	for tok, gr := range g.m {
		if !now.Before(gr.expires) {
			delete(g.m, tok)
		}
	}
	if len(g.m) >= MaxGrants {
		return "", errTooManyGrant
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	g.m[tok] = grant{id: id, expires: now.Add(GrantTTL)}
	return tok, nil
}

// use checks that token is an unused, unexpired grant for id, and uses it
// up. A grant presented for another id is used up too.
func (g *grants) use(id, token string) error {
	if token == "" {
		return errNoGrant
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	gr, ok := g.m[token]
	if !ok {
		return errUnknownGrant
	}
	delete(g.m, token)
	if !g.now().Before(gr.expires) {
		return errUnknownGrant
	}
	if subtle.ConstantTimeCompare([]byte(gr.id), []byte(id)) != 1 {
		return errGrantID
	}
	return nil
}

// checkID refuses an id a grant cannot be bound to.
func checkID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Errorf("grant id: want 1 to %d bytes, got %d", MaxIDLen, len(id))
	}
	for i := range len(id) {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("grant id: byte %#x at %d is not printable ASCII", c, i)
		}
	}
	return nil
}
