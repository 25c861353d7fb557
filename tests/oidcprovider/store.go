package oidcprovider

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// store is the provider's in-memory state: users, clients, and the grants
// and tokens issued. op.Storage is implemented in storage.go, the device
// grant in device.go.
type store struct {
	cfg Config
	key *signingKey

	mu            sync.Mutex
	users         map[string]*user // by username
	clients       map[string]client
	authRequests  map[string]*authRequest
	codes         map[string]string // authorization code → auth request ID
	accessTokens  map[string]accessToken
	refreshTokens map[string]*refreshToken
	devices       map[string]*device // by device code
	userCodes     map[string]string  // user code → device code
	sessions      map[string]deviceSession
}

func newStore(cfg Config) (*store, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	return &store{
		cfg:           cfg,
		key:           &signingKey{id: rand.Text(), key: key},
		users:         map[string]*user{},
		clients:       map[string]client{},
		authRequests:  map[string]*authRequest{},
		codes:         map[string]string{},
		accessTokens:  map[string]accessToken{},
		refreshTokens: map[string]*refreshToken{},
		devices:       map[string]*device{},
		userCodes:     map[string]string{},
		sessions:      map[string]deviceSession{},
	}, nil
}

func (s *store) addClient(c Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients[c.ID] = client{id: c.ID, secret: c.Secret, redirectURIs: slices.Clone(c.RedirectURIs), tokenLifetime: s.cfg.TokenLifetime}
}

func (s *store) setRedirectURIs(clientID string, uris []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[clientID]
	if !ok {
		return fmt.Errorf("set redirect URIs: unknown client %q", clientID)
	}
	c.redirectURIs = slices.Clone(uris)
	s.clients[clientID] = c
	return nil
}

func (s *store) addUser(username, password string, groups []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users[username] = &user{subject: subjectOf(username), username: username, password: password, groups: slices.Clone(groups)}
}

func (s *store) setGroups(username string, groups []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.users[username]
	if !ok {
		return fmt.Errorf("set groups: unknown user %q", username)
	}
	u.groups = slices.Clone(groups)
	return nil
}

func (s *store) disableUser(username string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.users[username]
	if !ok {
		return fmt.Errorf("disable user: unknown user %q", username)
	}
	u.disabled = true
	return nil
}

var errCredentials = errors.New("invalid username or password")

// checkPassword returns the user if the password is right and the user
// enabled. The caller holds mu.
func (s *store) checkPassword(username, password string) (*user, error) {
	u, ok := s.users[username]
	if !ok || subtle.ConstantTimeCompare([]byte(u.password), []byte(password)) != 1 {
		return nil, errCredentials
	}
	if u.disabled {
		return nil, fmt.Errorf("user %q is disabled", username)
	}
	return u, nil
}

// activeUser returns the enabled user with that subject. The caller holds mu.
func (s *store) activeUser(subject string) (*user, error) {
	for _, u := range s.users {
		if u.subject != subject {
			continue
		}
		if u.disabled {
			return nil, fmt.Errorf("user %q is disabled", u.username)
		}
		return u, nil
	}
	return nil, fmt.Errorf("no user with subject %q", subject)
}

// login marks an authorization request as authenticated by the user.
func (s *store) login(authRequestID, username, password string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.authRequests[authRequestID]
	if !ok {
		return fmt.Errorf("unknown or finished authorization request %q", authRequestID)
	}
	u, err := s.checkPassword(username, password)
	if err != nil {
		return err
	}
	a.subject, a.authTime, a.done = u.subject, time.Now(), true
	return nil
}

// signingKey signs ID tokens (RS256); its public half is served as the JWKS.
type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k *signingKey) ID() string                                  { return k.id }
func (k *signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *signingKey) Key() any                                    { return k.key }

type publicKey struct{ *signingKey }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.key.PublicKey }
