// Package client calls the operator API: POST {basePath}/{group}/{method}
// with protojson bodies (proto/api/v1). The CLI uses it; so can any Go
// program.
package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Client calls one control plane's API.
type Client struct {
	// BaseURL is the API's URL including its base path, such as
	// http://127.0.0.1:3000/api.
	BaseURL string
	// Token is the bearer token.
	Token string
	// HTTP is the HTTP client. Defaults to one with a 60 s timeout.
	HTTP *http.Client
}

// Error is an API error.
type Error struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
	// RetryAfter is the answer's Retry-After (RESOURCE_EXHAUSTED: how long
	// to wait before trying again); 0 when it had none.
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: %s", e.Code, e.Message)
	if e.Field != "" {
		msg = fmt.Sprintf("%s: %s: %s", e.Code, e.Field, e.Message)
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (try again in %s)", e.RetryAfter)
	}
	return msg
}

// newError is the Error of a non-200 answer res whose body is b.
func newError(res *http.Response, b []byte) *Error {
	e := &Error{Status: res.StatusCode}
	if json.Unmarshal(b, e) != nil || e.Code == "" {
		e.Code = cmp.Or(http.StatusText(res.StatusCode), "HTTP error")
		e.Message = strings.TrimSpace(string(b))
	}
	// Retry-After in seconds (RFC 9110 §10.2.3); the API never sends the
	// date form.
	if n, err := strconv.Atoi(strings.TrimSpace(res.Header.Get("Retry-After"))); err == nil && n > 0 {
		e.RetryAfter = time.Duration(n) * time.Second
	}
	return e
}

// EncodeError is a request that cannot be written as the API's JSON: a
// text field that is not valid UTF-8, which the API would refuse as
// INVALID_ARGUMENT. Nothing was sent.
type EncodeError struct {
	Method string
	Err    error
}

func (e *EncodeError) Error() string { return fmt.Sprintf("encode %s request: %v", e.Method, e.Err) }
func (e *EncodeError) Unwrap() error { return e.Err }

// Call invokes method ("group.method") with req and decodes into resp.
func (c *Client) Call(ctx context.Context, method string, req, resp proto.Message) error {
	group, name, ok := strings.Cut(method, ".")
	if !ok {
		return fmt.Errorf("method %q is not group.method", method)
	}
	body, err := protojson.Marshal(req)
	if err != nil {
		return &EncodeError{Method: method, Err: err}
	}
	url := strings.TrimRight(c.BaseURL, "/") + "/" + group + "/" + name
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Better-Compute", "1")
	if c.Token != "" {
		r.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	res, err := hc.Do(r)
	if err != nil {
		return fmt.Errorf("call %s: %w", method, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("read %s response: %w", method, err)
	}
	if res.StatusCode != http.StatusOK {
		return newError(res, b)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, resp); err != nil {
		return fmt.Errorf("decode %s response: %w", method, err)
	}
	return nil
}
