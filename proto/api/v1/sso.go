package apiv1

import "time"

// Single sign-on endpoints (docs/sso.md): called before the caller has a
// token, so they are not API methods. JSON in and out, errors as the
// API's.
const (
	// SSODevicePath starts the CLI's device flow: {"tenant": ""} →
	// SSODeviceResponse.
	SSODevicePath = "/sso/device"
	// SSOTokenPath gives a token: {"login": id} polls a device flow (202
	// {"pending": true, "interval": s} while not approved), or
	// {"refreshToken": secret} refreshes → SSOTokenResponse.
	SSOTokenPath = "/sso/token"
	// SSOLogoutPath ends the session of {"refreshToken": secret}.
	SSOLogoutPath = "/sso/logout"
)

// SSODeviceResponse is a device flow begun.
type SSODeviceResponse struct {
	Login                   string    `json:"login"`
	VerificationURI         string    `json:"verificationUri"`
	VerificationURIComplete string    `json:"verificationUriComplete,omitempty"`
	UserCode                string    `json:"userCode"`
	Interval                int       `json:"interval"`
	ExpiresAt               time.Time `json:"expiresAt"`
}

// SSOTokenResponse is a sign-in's or refresh's token.
type SSOTokenResponse struct {
	Pending  bool `json:"pending,omitempty"`
	Interval int  `json:"interval,omitempty"`

	Token            string    `json:"token,omitempty"`
	ExpiresAt        time.Time `json:"expiresAt,omitzero"`
	RefreshToken     string    `json:"refreshToken,omitempty"`
	SessionExpiresAt time.Time `json:"sessionExpiresAt,omitzero"`
	Name             string    `json:"name,omitempty"`
	Tenant           string    `json:"tenant,omitempty"`
	Role             string    `json:"role,omitempty"`
	Groups           []string  `json:"groups,omitempty"`
}
