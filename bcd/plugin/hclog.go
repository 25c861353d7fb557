package plugin

import (
	"context"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hcLogger is an hclog.Logger (what go-plugin logs through) that writes to a
// slog.Logger, scrubbing secrets. go-plugin logs two kinds of lines through
// it: its own, which are detail (demoted to debug), and, through the logger
// Named after the plugin's executable, the JSON lines a plugin writes on its
// stderr, which keep their level.
type hcLogger struct {
	log     *slog.Logger
	scrub   func(string) string
	name    string
	fromPlg bool // lines the plugin wrote: keep their level
	implied []any
}

func newHCLogger(l *slog.Logger, scrub func(string) string) *hcLogger {
	if scrub == nil {
		scrub = func(s string) string { return s }
	}
	return &hcLogger{log: l, scrub: scrub}
}

// slogLevel maps an hclog level to slog's. Trace is below slog's Debug.
func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (h *hcLogger) Log(level hclog.Level, msg string, args ...any) {
	lvl := slogLevel(level)
	if !h.fromPlg && lvl > slog.LevelDebug {
		lvl = slog.LevelDebug
	}
	ctx := context.Background()
	if !h.log.Enabled(ctx, lvl) {
		return
	}
	attrs := make([]slog.Attr, 0, (len(h.implied)+len(args))/2+1)
	if h.name != "" {
		attrs = append(attrs, slog.String(keyLogger, h.name))
	}
	attrs = h.appendArgs(attrs, h.implied)
	attrs = h.appendArgs(attrs, args)
	h.log.LogAttrs(ctx, lvl, h.scrub(msg), attrs...)
}

// appendArgs turns hclog's key/value list into attributes, dropping the
// plugin's own "timestamp" (the record has the host's time).
func (h *hcLogger) appendArgs(attrs []slog.Attr, args []any) []slog.Attr {
	for i := 0; i < len(args); i += 2 {
		key, ok := args[i].(string)
		if !ok {
			key = "!BADKEY"
		}
		if i+1 >= len(args) {
			attrs = append(attrs, slog.String("!BADKEY", h.scrub(key)))
			break
		}
		if key == "timestamp" && h.fromPlg {
			continue
		}
		attrs = append(attrs, scrubAttrFunc(slog.Any(key, args[i+1]), h.scrub))
	}
	return attrs
}

// scrubAttrFunc is scrubAttr for a scrub function rather than a list.
func scrubAttrFunc(a slog.Attr, scrub func(string) string) slog.Attr {
	v := a.Value.Resolve()
	switch x := v.Any().(type) {
	case string:
		return slog.String(a.Key, scrub(x))
	case error:
		return slog.String(a.Key, scrub(x.Error()))
	}
	if v.Kind() == slog.KindAny || v.Kind() == slog.KindGroup {
		text := v.String()
		if s := scrub(text); s != text {
			return slog.String(a.Key, s)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

func (h *hcLogger) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hcLogger) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hcLogger) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hcLogger) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hcLogger) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hcLogger) enabled(l hclog.Level) bool {
	lvl := slogLevel(l)
	if !h.fromPlg && lvl > slog.LevelDebug {
		lvl = slog.LevelDebug
	}
	return h.log.Enabled(context.Background(), lvl)
}

func (h *hcLogger) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *hcLogger) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hcLogger) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hcLogger) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hcLogger) IsError() bool { return h.enabled(hclog.Error) }

func (h *hcLogger) ImpliedArgs() []any { return h.implied }

func (h *hcLogger) With(args ...any) hclog.Logger {
	c := *h
	c.implied = append(append([]any(nil), h.implied...), args...)
	return &c
}

func (h *hcLogger) Name() string { return h.name }

// Named returns a logger for part of go-plugin. go-plugin writes a plugin's
// stderr lines to the one named after the executable (bcx-<name>); lines
// through that one keep their level.
func (h *hcLogger) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	c.fromPlg = strings.HasPrefix(name, ExecPrefix)
	return &c
}

func (h *hcLogger) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	c.fromPlg = strings.HasPrefix(name, ExecPrefix)
	return &c
}

// SetLevel does nothing: the slog handler decides.
func (h *hcLogger) SetLevel(hclog.Level) {}

// GetLevel returns the lowest level the handler takes.
func (h *hcLogger) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if h.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

func (h *hcLogger) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(h.log.Handler(), slog.LevelDebug)
}

func (h *hcLogger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return h.StandardLogger(opts).Writer()
}

var _ hclog.Logger = (*hcLogger)(nil)
