package oidcprovider

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/net/html"
)

// ApproveDevice does what a person does in a browser to approve a device:
// it opens the verification URI, submits userCode, logs in with username
// and password, and presses Allow. The device's next poll then gets its
// tokens. An error names the step that failed (open verification page,
// submit user code, log in, approve) and what the page said.
func (p *Provider) ApproveDevice(ctx context.Context, userCode, username, password string) error {
	return p.decideDevice(ctx, userCode, username, password, "allow", "approve")
}

// DenyDevice is ApproveDevice pressing Deny: the device's next poll gets
// access_denied.
func (p *Provider) DenyDevice(ctx context.Context, userCode, username, password string) error {
	return p.decideDevice(ctx, userCode, username, password, "deny", "deny")
}

func (p *Provider) decideDevice(ctx context.Context, userCode, username, password, action, step string) error {
	jar, err := cookiejar.New(nil)
	if err != nil {
		return fmt.Errorf("cookie jar: %w", err)
	}
	b := &http.Client{Jar: jar}

	pg, err := get(ctx, b, p.issuer+"/device")
	if err != nil {
		return fmt.Errorf("open verification page: %w", err)
	}
	pg, err = pg.fillAndSubmit(ctx, b, map[string]string{"user_code": userCode}, "")
	if err != nil {
		return fmt.Errorf("submit user code: %w", err)
	}
	pg, err = pg.fillAndSubmit(ctx, b, map[string]string{"username": username, "password": password}, "")
	if err != nil {
		return fmt.Errorf("log in: %w", err)
	}
	if _, err := pg.fillAndSubmit(ctx, b, nil, action); err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return nil
}

// page is an HTML page as a browser got it, after redirects.
type page struct {
	url    *url.URL
	status int
	header http.Header
	body   []byte
}

func get(ctx context.Context, c *http.Client, rawURL string) (*page, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, err
	}
	return fetch(c, req)
}

func fetch(c *http.Client, req *http.Request) (*page, error) {
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", resp.Request.URL, err)
	}
	pg := &page{url: resp.Request.URL, status: resp.StatusCode, header: resp.Header, body: body}
	if pg.status != http.StatusOK && pg.status != http.StatusFound {
		return pg, fmt.Errorf("%s answered %d: %s", pg.url.Path, pg.status, pg.message())
	}
	return pg, nil
}

// message is the page's #error text, or its start if it has none.
func (pg *page) message() string {
	doc, err := html.Parse(strings.NewReader(string(pg.body)))
	if err == nil {
		for n := range doc.Descendants() {
			if attr(n, "id") == "error" {
				return strings.TrimSpace(text(n))
			}
		}
	}
	s := strings.TrimSpace(string(pg.body))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// fillAndSubmit fills the page's form (each field must exist), presses the
// submit button whose value is button (any if ""), and posts it.
func (pg *page) fillAndSubmit(ctx context.Context, c *http.Client, fields map[string]string, button string) (*page, error) {
	f, err := pg.form()
	if err != nil {
		return nil, err
	}
	for name, value := range fields {
		if _, ok := f.values[name]; !ok {
			return nil, fmt.Errorf("%s has no field %q", pg.url.Path, name)
		}
		f.values.Set(name, value)
	}
	if button != "" {
		i := slices.IndexFunc(f.buttons, func(b [2]string) bool { return b[1] == button })
		if i < 0 {
			return nil, fmt.Errorf("%s has no %q button", pg.url.Path, button)
		}
		f.values.Set(f.buttons[i][0], button)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.action, strings.NewReader(f.values.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return fetch(c, req)
}

// form is a page's first form, as a browser would submit it.
type form struct {
	action  string     // absolute URL
	values  url.Values // named inputs and their current values
	buttons [][2]string
}

func (pg *page) form() (*form, error) {
	doc, err := html.Parse(strings.NewReader(string(pg.body)))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", pg.url.Path, err)
	}
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode || n.Data != "form" {
			continue
		}
		if !strings.EqualFold(attr(n, "method"), "post") {
			return nil, fmt.Errorf("%s: form method is %q, want post", pg.url.Path, attr(n, "method"))
		}
		action, err := pg.url.Parse(attr(n, "action"))
		if err != nil {
			return nil, fmt.Errorf("%s: form action: %w", pg.url.Path, err)
		}
		f := &form{action: action.String(), values: url.Values{}}
		for e := range n.Descendants() {
			name := attr(e, "name")
			switch {
			case e.Type != html.ElementNode || name == "":
			case e.Data == "button":
				f.buttons = append(f.buttons, [2]string{name, attr(e, "value")})
			case e.Data == "input":
				f.values.Set(name, attr(e, "value"))
			}
		}
		return f, nil
	}
	return nil, fmt.Errorf("%s has no form: %s", pg.url.Path, pg.message())
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func text(n *html.Node) string {
	var b strings.Builder
	for d := range n.Descendants() {
		if d.Type == html.TextNode {
			b.WriteString(d.Data)
		}
	}
	return b.String()
}
