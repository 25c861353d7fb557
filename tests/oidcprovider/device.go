package oidcprovider

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/zitadel/oidc/v3/pkg/op"
)

// This file implements op.DeviceAuthorizationStorage and the state behind
// the device pages.

var _ op.DeviceAuthorizationStorage = (*store)(nil)

type device struct {
	userCode string
	state    op.DeviceAuthorizationState
}

// deviceSession is a person logged in on the device pages, about to approve
// or deny one user code.
type deviceSession struct {
	userCode, subject string
}

func (s *store) StoreDeviceAuthorization(_ context.Context, clientID, deviceCode, userCode string, expires time.Time, scopes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.clients[clientID]; !ok {
		return fmt.Errorf("unknown client %q", clientID)
	}
	if _, ok := s.userCodes[userCode]; ok {
		return op.ErrDuplicateUserCode
	}
	s.devices[deviceCode] = &device{userCode: userCode, state: op.DeviceAuthorizationState{ClientID: clientID, Scopes: scopes, Expires: expires}}
	s.userCodes[userCode] = deviceCode
	return nil
}

// GetDeviceAuthorizatonState is polled by the token endpoint. A device code
// is good for one token response: it is forgotten once reported done.
func (s *store) GetDeviceAuthorizatonState(_ context.Context, clientID, deviceCode string) (*op.DeviceAuthorizationState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.devices[deviceCode]
	if !ok || d.state.ClientID != clientID {
		return nil, errors.New("unknown device code")
	}
	state := d.state
	if state.Done {
		delete(s.devices, deviceCode)
		delete(s.userCodes, d.userCode)
	}
	return &state, nil
}

// pendingDevice returns the device authorization waiting for userCode.
// The caller holds mu.
func (s *store) pendingDevice(userCode string) (*device, error) {
	d, ok := s.devices[s.userCodes[normalizeUserCode(userCode)]]
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown user code %q", userCode)
	case d.state.Done || d.state.Denied:
		return nil, fmt.Errorf("user code %q is already used", userCode)
	case time.Now().After(d.state.Expires):
		return nil, fmt.Errorf("user code %q has expired", userCode)
	}
	return d, nil
}

// checkUserCode reports whether a device authorization waits for userCode.
func (s *store) checkUserCode(userCode string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.pendingDevice(userCode)
	return err
}

// deviceLogin checks the person's password and opens a session in which
// they approve or deny the device. It returns the session ID and the device
// authorization's client and scopes, to show.
func (s *store) deviceLogin(userCode, username, password string) (string, op.DeviceAuthorizationState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.pendingDevice(userCode)
	if err != nil {
		return "", op.DeviceAuthorizationState{}, err
	}
	u, err := s.checkPassword(username, password)
	if err != nil {
		return "", op.DeviceAuthorizationState{}, err
	}
	id := rand.Text()
	s.sessions[id] = deviceSession{userCode: d.userCode, subject: u.subject}
	return id, d.state, nil
}

// deviceDecide ends a device session, approving or denying its device.
func (s *store) deviceDecide(sessionID string, allow bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessions[sessionID]
	if !ok {
		return errors.New("no device login session: log in first")
	}
	delete(s.sessions, sessionID)
	d, err := s.pendingDevice(sess.userCode)
	if err != nil {
		return err
	}
	if !allow {
		d.state.Denied = true
		return nil
	}
	d.state.Done, d.state.Subject, d.state.AuthTime, d.state.AMR = true, sess.subject, time.Now(), []string{"pwd"}
	return nil
}

// normalizeUserCode forgives what people type: case and surrounding space.
func normalizeUserCode(code string) string {
	return strings.ToUpper(strings.TrimSpace(code))
}
