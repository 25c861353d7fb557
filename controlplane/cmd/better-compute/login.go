package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// envCredentials names the file the CLI keeps its sign-ins in.
const envCredentials = "BETTER_COMPUTE_CREDENTIALS"

// refreshBefore is how long before its token expires the CLI refreshes a
// sign-in.
const refreshBefore = 30 * time.Second

// credential is one server's sign-in as the CLI keeps it: the answer of
// the sign-in or of its last refresh (the short-lived token and the
// refresh secret that renews it; docs/sso.md), as the endpoint gave it.
type credential = apiv1.SSOTokenResponse

// credentials are the sign-ins of every server, keyed by the API URL.
type credentials struct {
	Servers map[string]*credential `json:"servers"`
}

// credentialsPath is $BETTER_COMPUTE_CREDENTIALS, else
// $XDG_CONFIG_HOME/better-compute/credentials.json, else
// ~/.config/better-compute/credentials.json; "" when there is no home.
func (e *env) credentialsPath() string {
	if p := e.getenv(envCredentials); p != "" {
		return p
	}
	dir := e.getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home := e.getenv("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "better-compute", "credentials.json")
}

// readCredentials reads the sign-ins; a missing file is none.
func (e *env) readCredentials() (*credentials, error) {
	c := &credentials{Servers: map[string]*credential{}}
	path := e.credentialsPath()
	if path == "" {
		return c, nil
	}
	b, err := readBounded(path, 1<<20, "the credentials file is at most 1 MiB")
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("read the sign-ins in %s: %w (remove the file and run login)", path, err)
	}
	if c.Servers == nil {
		c.Servers = map[string]*credential{}
	}
	return c, nil
}

// writeCredentials replaces the file (mode 0600, its directory 0700).
func (e *env) writeCredentials(c *credentials) error {
	path := e.credentialsPath()
	if path == "" {
		return errors.New("no place for the sign-in: set HOME or " + envCredentials)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("keep the sign-in: %w", err)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".credentials-*")
	if err != nil {
		return fmt.Errorf("keep the sign-in: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("keep the sign-in: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("keep the sign-in: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		return fmt.Errorf("keep the sign-in: %w", err)
	}
	return os.Rename(tmp.Name(), path)
}

// signedIn returns the token of the sign-in kept for server, refreshed
// first when it expires within refreshBefore; "" when there is none. A
// sign-in the control plane refuses to refresh is removed, and its error
// says to run login.
func (e *env) signedIn(ctx context.Context, server string, hc *http.Client) (string, error) {
	path := e.credentialsPath()
	if path == "" {
		return "", nil
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	// Commands run side by side (xargs -P) refresh one at a time: a
	// refresh secret works once, so the next one reads the new token.
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	creds, err := e.readCredentials()
	if err != nil {
		return "", err
	}
	c := creds.Servers[server]
	if c == nil {
		return "", nil
	}
	if time.Now().Before(c.ExpiresAt.Add(-refreshBefore)) {
		return c.Token, nil
	}
	var resp apiv1.SSOTokenResponse
	if err := ssoCall(ctx, hc, server, apiv1.SSOTokenPath, map[string]string{"refreshToken": c.RefreshToken}, &resp); err != nil {
		var ae *client.Error
		if errors.As(err, &ae) && ae.Code == apiv1.CodeUnauthenticated {
			delete(creds.Servers, server)
			_ = e.writeCredentials(creds)
			return "", fmt.Errorf("your sign-in to %s ended: %s; run better-compute login", server, ae.Message)
		}
		return "", fmt.Errorf("refresh the sign-in to %s: %w", server, err)
	}
	creds.Servers[server] = &resp
	if err := e.writeCredentials(creds); err != nil {
		return "", err
	}
	return resp.Token, nil
}

// keepCredential sets (nil: removes) the sign-in kept for server, under
// the file's lock.
func (e *env) keepCredential(server string, c *credential) error {
	path := e.credentialsPath()
	if path == "" {
		return errors.New("no place for the sign-in: set HOME or " + envCredentials)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("keep the sign-in: %w", err)
	}
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return err
	}
	defer unlock()
	creds, err := e.readCredentials()
	if err != nil {
		return err
	}
	if c == nil {
		delete(creds.Servers, server)
	} else {
		creds.Servers[server] = c
	}
	return e.writeCredentials(creds)
}

// ssoCall posts body to the sign-in endpoint path of server (the API URL)
// and decodes the answer into out; an error answer is a *client.Error.
// It returns the HTTP status.
func ssoCall(ctx context.Context, hc *http.Client, server, path string, body, out any) error {
	_, err := ssoPost(ctx, hc, server, path, body, out)
	return err
}

func ssoPost(ctx context.Context, hc *http.Client, server, path string, body, out any) (int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, server+path, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		ae := &client.Error{Status: resp.StatusCode}
		if json.Unmarshal(data, ae) != nil || ae.Code == "" {
			ae.Code, ae.Message = "UNKNOWN", strings.TrimSpace(string(data))
		}
		return resp.StatusCode, ae
	}
	return resp.StatusCode, json.Unmarshal(data, out)
}

func loginCmd(e *env) *cobra.Command {
	af := &apiFlags{}
	var tenant string
	var noBrowser bool
	cmd := &cobra.Command{
		Use:   "login",
		Short: "Sign in through your organisation's identity provider (OAuth device flow)",
		Long: `login signs you in through the OpenID provider the control plane is
configured with (iam.oidc, docs/sso.md), with the OAuth 2.0 device
authorization grant (RFC 8628): it prints a URL and a code; open the URL in
any browser, on any machine, enter the code and sign in there. Your groups
at the provider give you a role in a tenant (iam.oidc.groups).

The CLI keeps a short-lived token and a refresh secret in
~/.config/better-compute/credentials.json (mode 0600; $` + envCredentials + `
names another file) and refreshes the token by itself before each command
that needs it; a group removed at the provider is lost at the next refresh.
--token and ` + envToken + ` still win over a sign-in. Machines and scripts
keep API tokens.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			server, hc, err := e.ssoTarget(af)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var start apiv1.SSODeviceResponse
			if err := ssoCall(ctx, hc, server, apiv1.SSODevicePath, map[string]string{"tenant": tenant}, &start); err != nil {
				return fmt.Errorf("start the sign-in at %s: %w", server, err)
			}
			fmt.Fprintf(e.stdout, "To sign in, open %s and enter the code %s\n", start.VerificationURI, start.UserCode)
			if start.VerificationURIComplete != "" {
				fmt.Fprintf(e.stdout, "(or open %s)\n", start.VerificationURIComplete)
			}
			if !noBrowser {
				openBrowser(cmp.Or(start.VerificationURIComplete, start.VerificationURI))
			}
			fmt.Fprintf(e.stdout, "Waiting for you to approve (until %s)...\n", start.ExpiresAt.Local().Format(time.Kitchen))
			for {
				var resp apiv1.SSOTokenResponse
				status, err := ssoPost(ctx, hc, server, apiv1.SSOTokenPath, map[string]string{"login": start.Login}, &resp)
				if err != nil {
					return fmt.Errorf("sign in: %w", err)
				}
				if status == http.StatusAccepted {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(time.Duration(max(resp.Interval, 1)) * time.Second):
					}
					continue
				}
				if err := e.keepCredential(server, &resp); err != nil {
					return err
				}
				groups := "none"
				if len(resp.Groups) > 0 {
					groups = strings.Join(resp.Groups, ", ")
				}
				fmt.Fprintf(e.stdout, "Signed in to %s as %s: %s in tenant %s (groups: %s), until %s\n", server, resp.Name, resp.Role,
					resp.Tenant, groups, resp.SessionExpiresAt.Local().Format(time.RFC3339))
				return nil
			}
		},
	}
	af.add(cmd)
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant to sign in to (id or name; default: the one your groups give a role in)")
	cmd.Flags().BoolVar(&noBrowser, "no-browser", false, "do not open a browser: only print the URL and the code")
	return cmd
}

func logoutCmd(e *env) *cobra.Command {
	af := &apiFlags{}
	cmd := &cobra.Command{
		Use:   "logout",
		Short: "End your sign-in to the server and forget its token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			server, hc, err := e.ssoTarget(af)
			if err != nil {
				return err
			}
			creds, err := e.readCredentials()
			if err != nil {
				return err
			}
			c := creds.Servers[server]
			if c == nil {
				fmt.Fprintf(e.stdout, "Not signed in to %s\n", server)
				return nil
			}
			var out struct{}
			if err := ssoCall(cmd.Context(), hc, server, apiv1.SSOLogoutPath, map[string]string{"refreshToken": c.RefreshToken}, &out); err != nil {
				return fmt.Errorf("sign out of %s: %w", server, err)
			}
			if err := e.keepCredential(server, nil); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "Signed out of %s\n", server)
			return nil
		},
	}
	af.add(cmd)
	return cmd
}

// ssoTarget is the API URL login and logout talk to, and the HTTP client
// (the same server resolution and TLS trust as every API command, no token
// needed).
func (e *env) ssoTarget(af *apiFlags) (string, *http.Client, error) {
	f := *af
	if f.token == "" {
		f.token = "-" // the token is not needed: resolve the server only
	}
	c, err := e.client(&f)
	if err != nil {
		return "", nil, err
	}
	return c.BaseURL, c.HTTP, nil
}

// lockFile holds an exclusive lock on path (made 0600 when missing)
// until the returned function.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the sign-ins: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the sign-ins: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// openBrowser tries to open url in the person's browser; failing is fine
// (the URL is printed).
func openBrowser(url string) {
	name := "xdg-open"
	if runtime.GOOS == "darwin" {
		name = "open"
	}
	if path, err := exec.LookPath(name); err == nil {
		cmd := exec.Command(path, url)
		if cmd.Start() == nil {
			go func() { _ = cmd.Wait() }()
		}
	}
}
