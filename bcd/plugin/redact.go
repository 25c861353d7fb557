package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Redacted replaces a secret in errors and logs.
const Redacted = "[REDACTED]"

// Scrub returns s with every occurrence of each non-empty secret replaced by
// Redacted.
func Scrub(s string, secrets ...string) string {
	for _, sec := range secrets {
		if sec != "" && strings.Contains(s, sec) {
			s = strings.ReplaceAll(s, sec, Redacted)
		}
	}
	return s
}

// RedactHandler wraps h so that every record it passes on has the secrets
// secrets returns scrubbed from its message and from its attributes' string,
// error and Stringer values, groups included. Other values are printed and
// scrubbed only when their text holds a secret. Plugins wrap their logger
// with it for each call's password.
func RedactHandler(h slog.Handler, secrets func() []string) slog.Handler {
	return &redactHandler{inner: h, secrets: secrets}
}

type redactHandler struct {
	inner   slog.Handler
	secrets func() []string
}

func (r *redactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return r.inner.Enabled(ctx, l)
}

func (r *redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	secs := r.secrets()
	if len(secs) == 0 {
		return r.inner.Handle(ctx, rec)
	}
	out := slog.NewRecord(rec.Time, rec.Level, Scrub(rec.Message, secs...), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(scrubAttr(a, secs))
		return true
	})
	return r.inner.Handle(ctx, out)
}

func (r *redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	secs := r.secrets()
	scrubbed := make([]slog.Attr, len(as))
	for i, a := range as {
		scrubbed[i] = scrubAttr(a, secs)
	}
	return &redactHandler{inner: r.inner.WithAttrs(scrubbed), secrets: r.secrets}
}

func (r *redactHandler) WithGroup(name string) slog.Handler {
	return &redactHandler{inner: r.inner.WithGroup(name), secrets: r.secrets}
}

func scrubAttr(a slog.Attr, secs []string) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Scrub(v.String(), secs...))
	case slog.KindGroup:
		group := v.Group()
		out := make([]any, len(group))
		for i, g := range group {
			out[i] = scrubAttr(g, secs)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		var text string
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, Scrub(x.Error(), secs...))
		case fmt.Stringer:
			return slog.String(a.Key, Scrub(x.String(), secs...))
		default:
			text = fmt.Sprintf("%+v", x)
		}
		if s := Scrub(text, secs...); s != text {
			return slog.String(a.Key, s)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// secretSet holds the secrets of calls in flight, and of calls that ended in
// the last retention, so that plugin log lines that arrive late are
// scrubbed too.
type secretSet struct {
	retention time.Duration
	now       func() time.Time

	mu      sync.Mutex
	inUse   map[string]int
	expires map[string]time.Time
}

func newSecretSet(retention time.Duration, now func() time.Time) *secretSet {
	return &secretSet{
		retention: retention,
		now:       now,
		inUse:     make(map[string]int),
		expires:   make(map[string]time.Time),
	}
}

// hold adds s (when not empty) until the returned release is called, and
// for the retention after.
func (s *secretSet) hold(secret string) (release func()) {
	if secret == "" {
		return func() {}
	}
	s.mu.Lock()
	s.inUse[secret]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.inUse[secret]--; s.inUse[secret] <= 0 {
				delete(s.inUse, secret)
				s.expires[secret] = s.now().Add(s.retention)
			}
		})
	}
}

// list returns the secrets to scrub now, forgetting expired ones.
func (s *secretSet) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	out := make([]string, 0, len(s.inUse)+len(s.expires))
	for sec := range s.inUse {
		out = append(out, sec)
	}
	for sec, exp := range s.expires {
		if _, held := s.inUse[sec]; held {
			continue
		}
		if now.After(exp) {
			delete(s.expires, sec)
			continue
		}
		out = append(out, sec)
	}
	// Longer first, so a secret that holds another is replaced whole.
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// scrub removes every current secret from text.
func (s *secretSet) scrub(text string) string { return Scrub(text, s.list()...) }
