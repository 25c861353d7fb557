// Package oidcprovider runs a real OpenID Connect provider for end-to-end
// tests: zitadel's OpenID provider (github.com/zitadel/oidc/v3/pkg/op) over an
// in-memory store, served over plain HTTP on 127.0.0.1 on a free port.
//
// A test starts one with [Start], registers clients ([Provider.AddClient])
// and users ([Provider.AddUser]) and points its relying party at
// [Provider.Issuer]. Every client may use the authorization code flow (with
// PKCE S256; required for public clients), the refresh_token grant and the
// device authorization grant, with the scopes openid, profile, email and
// offline_access. A refresh token is issued only when offline_access is asked
// for; it is rotated on each use (the old one is then refused).
//
// Whenever openid is asked for, the ID token and the userinfo response carry
// sub, name, preferred_username, email, email_verified and the groups claim
// (named by [Config.GroupsClaim], a JSON array of strings, possibly empty).
// Claims are read when a token is issued, so after [Provider.SetGroups] the
// next token (a refresh included: every refresh_token grant answers with a
// fresh ID token) carries the new groups.
//
// # Browser login (authorization code flow)
//
// The authorization endpoint redirects the browser to a plain HTML page,
// GET /login?authRequestID=..., with no JavaScript. A headless browser fills:
//
//	#username                 text input, the username given to AddUser
//	#password                 password input
//	button[type=submit]       the single submit button (id "login")
//
// and submits. On success the browser is redirected (through zitadel's
// /authorize/callback) to the relying party's redirect_uri with code and
// state: there is no consent step.
// On a wrong password (or a disabled user) the same form comes back with
// status 401 and the message in #error; nothing is redirected.
//
// # Device pages
//
// The verification URI is Issuer()+"/device". A person GETs it, submits the
// user code (#user_code), logs in (#username, #password) and then approves
// (button[name=action][value=allow]) or denies (button[name=action][value=deny]).
// [Provider.ApproveDevice] and [Provider.DenyDevice] do exactly that over HTTP.
// The device flow's poll interval is 1 s; a device code yields tokens once.
//
// On the device token poll zitadel takes a confidential client's secret
// only from HTTP Basic auth (x/oauth2's default auto-detection sends that
// first). For a public client auto-detection first tries Basic auth, which
// is refused, then the form: set Endpoint.AuthStyle to
// oauth2.AuthStyleInParams to skip the wasted request.
package oidcprovider
