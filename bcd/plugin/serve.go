package plugin

import (
	"io"
	"log/slog"
	"strings"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// Serve runs a plugin process: a bcx-<name> main calls it with its
// implementation once it is ready. It serves the calls of the bcd that
// started the process and returns when that bcd stops it; the process
// should then exit. Started by hand (without bcd's handshake), it prints that
// the binary is a plugin and exits with status 1.
//
// log receives go-plugin's own messages at debug level; build it on
// NewLogHandler(os.Stderr, ...) so that bcd reads the plugin's log lines with
// their levels.
func Serve(impl pluginv1.PluginServiceServer, log *slog.Logger) {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: versionedPlugins(impl),
		GRPCServer:       goplugin.DefaultGRPCServer,
		Logger:           newHCLogger(log, nil),
	})
}

// hclogTimeFormat is the timestamp layout the host parses in a plugin's
// JSON log lines (go-plugin's parseJSON).
const hclogTimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// NewLogHandler returns the slog handler a plugin process logs through: one
// JSON object per line on w (the process's stderr), with the "@timestamp",
// "@level" and "@message" keys bcd's go-plugin reads, so bcd logs each line
// at its level with the plugin's attributes. opts.ReplaceAttr, if set, runs
// first. Wrap it in RedactHandler for every secret a call holds.
func NewLogHandler(w io.Writer, opts *slog.HandlerOptions) slog.Handler {
	o := slog.HandlerOptions{}
	if opts != nil {
		o = *opts
	}
	user := o.ReplaceAttr
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if user != nil {
			a = user(groups, a)
		}
		if len(groups) > 0 {
			return a
		}
		switch a.Key {
		case slog.TimeKey:
			if t, ok := a.Value.Any().(time.Time); ok {
				return slog.String("@timestamp", t.UTC().Format(hclogTimeFormat))
			}
		case slog.LevelKey:
			if l, ok := a.Value.Any().(slog.Level); ok {
				return slog.String("@level", hclogLevel(l))
			}
		case slog.MessageKey:
			return slog.Attr{Key: "@message", Value: a.Value}
		}
		return a
	}
	return slog.NewJSONHandler(w, &o)
}

// hclogLevel is the hclog level name of l.
func hclogLevel(l slog.Level) string {
	switch {
	case l < slog.LevelDebug:
		return "trace"
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warn"
	default:
		return "error"
	}
}

// IsVersionFlag reports whether args (os.Args[1:]) ask a plugin for its
// version: "--version" or "-version". A plugin's main prints it and exits
// instead of calling Serve, so installers can check an executable.
func IsVersionFlag(args []string) bool {
	return len(args) == 1 && strings.TrimLeft(args[0], "-") == "version" && strings.HasPrefix(args[0], "-")
}
