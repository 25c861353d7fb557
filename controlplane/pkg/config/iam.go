package config

import (
	"fmt"
	"net/url"
	"slices"
	"time"
)

// IAM configures how people sign in (key iam; docs/sso.md). Machines and
// scripts keep API tokens; people sign in through the organisation's
// OpenID provider.
type IAM struct {
	// OIDC is the OpenID provider people sign in with; off while its
	// issuer is empty.
	OIDC OIDC `yaml:"oidc"`
}

// OIDC is single sign-on through an OpenID Connect provider: the CLI's
// `better-compute login` (the OAuth device authorization grant, RFC 8628)
// and the fleet page's login (the authorization code grant with PKCE,
// RFC 7636), as a confidential client of the provider.
type OIDC struct {
	// Issuer is the provider's issuer URL (its discovery document is at
	// Issuer/.well-known/openid-configuration). Empty: single sign-on is
	// off.
	Issuer string `yaml:"issuer"`
	// ClientID is this deployment's client at the provider. Required with
	// Issuer. The provider must allow it the device code, authorization
	// code and refresh token grants, and the redirect URI
	// {host.publicURL}/watch/sso/callback.
	ClientID string `yaml:"clientId"`
	// ClientSecret is the client's secret (use ${ENV}); empty for a public
	// client.
	ClientSecret string `yaml:"clientSecret"`
	// GroupsClaim is the ID token claim that lists the person's groups.
	// Defaults to "groups".
	GroupsClaim string `yaml:"groupsClaim"`
	// Scopes are asked for besides openid, profile, email and
	// offline_access (some providers need "groups").
	Scopes []string `yaml:"scopes"`
	// Groups map the provider's groups to a role in a tenant: a person
	// holds, in the tenant they sign in to, the highest role of the
	// entries whose group they are in. At least one entry with Issuer.
	Groups []OIDCGroup `yaml:"groups"`
	// TokenTTL is the life of the bearer token a sign-in or refresh gives
	// (the CLI refreshes it by itself): how long a group removed at the
	// provider keeps its rights at most. Defaults to 10 min; 1 s to 24 h.
	TokenTTL Duration `yaml:"tokenTTL"`
	// SessionTTL is how long a sign-in lasts, refreshes included, before
	// the person signs in again. Defaults to 12 h; 1 min to 30 days.
	SessionTTL Duration `yaml:"sessionTTL"`
}

// OIDCGroup maps one provider group to a role in a tenant.
type OIDCGroup struct {
	// Group is the group's name as the groups claim lists it.
	Group string `yaml:"group"`
	// Tenant is the tenant (name or id). Defaults to "root".
	Tenant string `yaml:"tenant"`
	// Role is admin, operator or viewer.
	Role string `yaml:"role"`
}

// Enabled reports whether single sign-on is configured.
func (o *OIDC) Enabled() bool { return o.Issuer != "" }

func (o *OIDC) defaults() {
	if o.GroupsClaim == "" {
		o.GroupsClaim = "groups"
	}
	if o.TokenTTL.Duration == 0 {
		o.TokenTTL.Duration = 10 * time.Minute
	}
	if o.SessionTTL.Duration == 0 {
		o.SessionTTL.Duration = 12 * time.Hour
	}
	for i := range o.Groups {
		if o.Groups[i].Tenant == "" {
			o.Groups[i].Tenant = "root"
		}
	}
}

// maxOIDCGroups bounds iam.oidc.groups.
const maxOIDCGroups = 1000

func (o *OIDC) validate() error {
	if !o.Enabled() {
		if o.ClientID != "" || len(o.Groups) > 0 {
			return &Error{Key: "iam.oidc.issuer", Msg: "required with iam.oidc.clientId or iam.oidc.groups"}
		}
		return nil
	}
	if u, err := url.Parse(o.Issuer); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return &Error{Key: "iam.oidc.issuer", Msg: fmt.Sprintf("%q: want the provider's issuer URL, https://host[/path] (http only for a provider on this machine's network you trust)", o.Issuer)}
	}
	if o.ClientID == "" {
		return &Error{Key: "iam.oidc.clientId", Msg: "required with iam.oidc.issuer"}
	}
	if o.TokenTTL.Duration < time.Second || o.TokenTTL.Duration > 24*time.Hour {
		return &Error{Key: "iam.oidc.tokenTTL", Msg: fmt.Sprintf("%v: want 1s to 24h", o.TokenTTL.Duration)}
	}
	if o.SessionTTL.Duration < time.Minute || o.SessionTTL.Duration > 30*24*time.Hour {
		return &Error{Key: "iam.oidc.sessionTTL", Msg: fmt.Sprintf("%v: want 1m to 720h", o.SessionTTL.Duration)}
	}
	if len(o.Groups) == 0 {
		return &Error{Key: "iam.oidc.groups", Msg: "map at least one group to a tenant and role: nobody could sign in"}
	}
	if len(o.Groups) > maxOIDCGroups {
		return &Error{Key: "iam.oidc.groups", Msg: fmt.Sprintf("%d entries: at most %d", len(o.Groups), maxOIDCGroups)}
	}
	for i, g := range o.Groups {
		key := fmt.Sprintf("iam.oidc.groups[%d]", i)
		switch {
		case g.Group == "" || len(g.Group) > 256:
			return &Error{Key: key + ".group", Msg: "want the group's name, 1 to 256 bytes"}
		case !slices.Contains([]string{"admin", "operator", "viewer"}, g.Role):
			return &Error{Key: key + ".role", Msg: fmt.Sprintf("%q: want admin, operator or viewer", g.Role)}
		}
	}
	return nil
}
