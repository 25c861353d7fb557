package upgrade

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Download defaults.
const (
	// DefaultAttempts is how many times a download is tried.
	DefaultAttempts = 4
	// DefaultRetryDelay is the wait before the second attempt; it doubles
	// with each later one.
	DefaultRetryDelay = time.Second
	// connectTimeout bounds dialling and the TLS handshake.
	connectTimeout = 15 * time.Second
	// headerTimeout bounds the wait for a response's headers.
	headerTimeout = 30 * time.Second
	// maxErrorBody bounds the error body read for the message.
	maxErrorBody = 4 << 10
)

// newHTTPClient is the client downloads use: bounded connect, TLS and
// header waits; the body may take as long as the command's deadline.
func newHTTPClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = connectTimeout
	tr.ResponseHeaderTimeout = headerTimeout
	return &http.Client{Transport: tr}
}

// fetcher downloads with retries.
type fetcher struct {
	client   *http.Client
	attempts int
	delay    time.Duration
}

// errPermanent marks a failure a retry cannot fix (404, 403, ...).
type errPermanent struct{ error }

func (e errPermanent) Unwrap() error { return e.error }

// retry runs fn up to f.attempts times, waiting between tries, until it
// succeeds, fails permanently or ctx ends.
func (f *fetcher) retry(ctx context.Context, fn func() error) error {
	delay := f.delay
	var err error
	for i := range f.attempts {
		if i > 0 {
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("%w (after: %w)", ctx.Err(), err)
			case <-t.C:
			}
			delay *= 2
		}
		err = fn()
		var perm errPermanent
		if err == nil || errors.As(err, &perm) || ctx.Err() != nil {
			return err
		}
	}
	return fmt.Errorf("%w (tried %d times)", err, f.attempts)
}

// get downloads a small file, at most max bytes.
func (f *fetcher) get(ctx context.Context, url string, max int64) ([]byte, error) {
	var body []byte
	err := f.retry(ctx, func() error {
		resp, err := f.do(ctx, url, 0)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
		if err != nil {
			return fmt.Errorf("download %s: %w", url, err)
		}
		if int64(len(b)) > max {
			return errPermanent{fmt.Errorf("download %s: larger than %d bytes", url, max)}
		}
		body = b
		return nil
	})
	return body, err
}

// download writes url to dst, resuming an interrupted transfer with a range
// request, and checks the result's size and hex sha256.
func (f *fetcher) download(ctx context.Context, url, dst string, size int64, sum string) error {
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("download bcd: %w", err)
	}
	defer out.Close()
	var have int64
	err = f.retry(ctx, func() error {
		resp, err := f.do(ctx, url, have)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusPartialContent {
			// A full answer (the server ignored the range): start over.
			if err := out.Truncate(0); err != nil {
				return errPermanent{err}
			}
			have = 0
		}
		if _, err := out.Seek(have, io.SeekStart); err != nil {
			return errPermanent{err}
		}
		n, err := io.Copy(out, io.LimitReader(resp.Body, size-have+1))
		have += n
		if err != nil {
			return fmt.Errorf("download %s: %w", url, err)
		}
		if have < size {
			return fmt.Errorf("download %s: got %d of %d bytes", url, have, size)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if have != size {
		return fmt.Errorf("bcd from %s is %d bytes, but the signed manifest says %d: refusing to install it", url, have, size)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("download bcd: %w", err)
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("download bcd: %w", err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, out); err != nil {
		return fmt.Errorf("download bcd: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("bcd from %s has sha256 %s, but the signed manifest says %s: refusing to install it", url, got, sum)
	}
	return nil
}

// do sends one GET (from offset when positive) and returns a 200 or 206
// response; other statuses are errors, permanent for 4xx but 408 and 429.
func (f *fetcher) do(ctx context.Context, url string, offset int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, errPermanent{fmt.Errorf("download %s: %w", url, err)}
	}
	if offset > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", url, err)
	}
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusPartialContent && offset > 0 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	err = fmt.Errorf("download %s: %s%s", url, resp.Status, errorMessage(b))
	if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests {
		return nil, errPermanent{err}
	}
	return nil, err
}

// errorMessage returns ": message" of the control plane's JSON error body,
// or of a short plain-text body.
func errorMessage(b []byte) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &e) == nil && e.Message != "" {
		return ": " + e.Message
	}
	if s := strings.TrimSpace(string(b)); s != "" && len(s) <= 200 && !strings.ContainsAny(s, "<\n") {
		return ": " + s
	}
	return ""
}
