package oidcprovider

import (
	"context"
	"errors"
	"html/template"
	"net/http"

	"github.com/zitadel/oidc/v3/pkg/op"
)

// pages serves the HTML a person sees: the login form of the authorization
// code flow and the device pages. No JavaScript; every step is a POST form.
type pages struct {
	store    *store
	issuer   string
	callback func(context.Context, string) string // zitadel's URL that finishes an authorization request
}

const deviceSessionCookie = "device_session"

func (p *pages) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /login", p.loginForm)
	mux.HandleFunc("POST /login", p.login)
	mux.HandleFunc("GET /device", p.deviceStart)
	mux.HandleFunc("POST /device", p.deviceCode)
	mux.HandleFunc("POST /device/login", p.deviceLogin)
	mux.HandleFunc("POST /device/confirm", p.deviceConfirm)
}

// pageData is what the templates show; each uses a few fields.
type pageData struct {
	AuthRequestID, UserCode, ClientID, Error, Message string
	Scopes                                            []string
}

func (p *pages) loginForm(w http.ResponseWriter, r *http.Request) {
	render(w, http.StatusOK, "login", pageData{AuthRequestID: r.FormValue("authRequestID")})
}

// login checks the password and, without a consent step, hands the
// authorization request back to zitadel, which redirects to the client.
func (p *pages) login(w http.ResponseWriter, r *http.Request) {
	id := r.PostFormValue("authRequestID")
	if err := p.store.login(id, r.PostFormValue("username"), r.PostFormValue("password")); err != nil {
		render(w, failureStatus(err), "login", pageData{AuthRequestID: id, Error: err.Error()})
		return
	}
	ctx := op.ContextWithIssuer(r.Context(), p.issuer)
	http.Redirect(w, r, p.callback(ctx, id), http.StatusFound)
}

// deviceStart is the verification URI: it asks for the user code, unless
// the link carried it (verification_uri_complete).
func (p *pages) deviceStart(w http.ResponseWriter, r *http.Request) {
	if code := r.FormValue("user_code"); code != "" {
		p.deviceCode(w, r)
		return
	}
	render(w, http.StatusOK, "device_code", pageData{})
}

func (p *pages) deviceCode(w http.ResponseWriter, r *http.Request) {
	code := r.FormValue("user_code")
	if err := p.store.checkUserCode(code); err != nil {
		render(w, http.StatusBadRequest, "device_code", pageData{UserCode: code, Error: err.Error()})
		return
	}
	render(w, http.StatusOK, "device_login", pageData{UserCode: code})
}

func (p *pages) deviceLogin(w http.ResponseWriter, r *http.Request) {
	code := r.PostFormValue("user_code")
	session, state, err := p.store.deviceLogin(code, r.PostFormValue("username"), r.PostFormValue("password"))
	if err != nil {
		render(w, failureStatus(err), "device_login", pageData{UserCode: code, Error: err.Error()})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: deviceSessionCookie, Value: session, Path: "/device", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	render(w, http.StatusOK, "device_confirm", pageData{UserCode: code, ClientID: state.ClientID, Scopes: state.Scopes})
}

func (p *pages) deviceConfirm(w http.ResponseWriter, r *http.Request) {
	cookie, err := r.Cookie(deviceSessionCookie)
	if err != nil {
		render(w, http.StatusBadRequest, "device_done", pageData{Error: "no device login session: log in first"})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: deviceSessionCookie, Path: "/device", MaxAge: -1})
	allow := r.PostFormValue("action") == "allow"
	if err := p.store.deviceDecide(cookie.Value, allow); err != nil {
		render(w, http.StatusBadRequest, "device_done", pageData{Error: err.Error()})
		return
	}
	msg := "Device denied."
	if allow {
		msg = "Device approved. You can return to your device."
	}
	render(w, http.StatusOK, "device_done", pageData{Message: msg})
}

// failureStatus is 401 for a failed login, 400 for anything else.
func failureStatus(err error) int {
	if errors.Is(err, errCredentials) {
		return http.StatusUnauthorized
	}
	return http.StatusBadRequest
}

func render(w http.ResponseWriter, status int, name string, data pageData) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_ = templates.ExecuteTemplate(w, name, data) // the status is sent; a write error has no one to go to
}

var templates = template.Must(template.New("").Parse(`
{{define "top"}}<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{{.}}</title></head><body><h1>{{.}}</h1>{{end}}
{{define "error"}}<p id="error" style="color:red">{{.}}</p>{{end}}

{{define "login"}}{{template "top" "Log in"}}
<form method="post" action="/login">
<input type="hidden" name="authRequestID" value="{{.AuthRequestID}}">
<p><label for="username">Username</label> <input id="username" name="username" autocomplete="username" autofocus></p>
<p><label for="password">Password</label> <input id="password" name="password" type="password" autocomplete="current-password"></p>
{{template "error" .Error}}
<button id="login" type="submit">Log in</button>
</form></body></html>{{end}}

{{define "device_code"}}{{template "top" "Connect a device"}}
<form method="post" action="/device">
<p><label for="user_code">Code shown on your device</label> <input id="user_code" name="user_code" value="{{.UserCode}}" autofocus></p>
{{template "error" .Error}}
<button id="next" type="submit">Next</button>
</form></body></html>{{end}}

{{define "device_login"}}{{template "top" "Log in to connect a device"}}
<form method="post" action="/device/login">
<input type="hidden" name="user_code" value="{{.UserCode}}">
<p><label for="username">Username</label> <input id="username" name="username" autocomplete="username" autofocus></p>
<p><label for="password">Password</label> <input id="password" name="password" type="password" autocomplete="current-password"></p>
{{template "error" .Error}}
<button id="login" type="submit">Log in</button>
</form></body></html>{{end}}

{{define "device_confirm"}}{{template "top" "Connect a device"}}
<p>Allow <span id="client">{{.ClientID}}</span> (code {{.UserCode}}) the scopes <span id="scopes">{{range .Scopes}}{{.}} {{end}}</span>?</p>
<form method="post" action="/device/confirm">
<button id="allow" type="submit" name="action" value="allow">Allow</button>
<button id="deny" type="submit" name="action" value="deny">Deny</button>
</form></body></html>{{end}}

{{define "device_done"}}{{template "top" "Connect a device"}}
<p id="result">{{.Message}}</p>
{{template "error" .Error}}
</body></html>{{end}}
`))
