package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
)

// DefaultDir is where bcd looks for plugins unless configured otherwise.
const DefaultDir = "/usr/lib/bcd/plugins"

// DefaultBMCTimeout is the timeout of a BMC call whose target sets none
// (plugin.proto, BMCTarget.timeout).
const DefaultBMCTimeout = 30 * time.Second

// defaultPath is the PATH of plugin processes when bcd has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Config configures a Host.
type Config struct {
	// Dir is the plugin directory, searched for bcx-<name> executables.
	// Defaults to DefaultDir (/usr/lib/bcd/plugins). A missing directory
	// holds no plugins.
	Dir string
	// Env is the whole environment of plugin processes: bcd's own is not
	// passed on, so nothing in it (a join token, say) reaches a plugin.
	// Defaults to PATH alone, taken from bcd's environment (or a standard
	// PATH when bcd has none), which plugins need to find helpers such as
	// ipmitool.
	Env []string
	// SocketDir is where the private (mode 0700) directory holding each
	// plugin process's Unix socket is created. Defaults to os.TempDir().
	SocketDir string
	// StartTimeout bounds starting a plugin, from exec until it has
	// answered Info. Defaults to 10 s.
	StartTimeout time.Duration
	// CallTimeout bounds every call, whatever the caller's context or the
	// target's timeout say. Defaults to 2 min.
	CallTimeout time.Duration
	// CallGrace is added to a BMC call's own timeout (BMCTarget.timeout,
	// DefaultBMCTimeout when unset) to make the call's deadline, so that the
	// plugin's own timeout error, which says more, arrives first. Defaults
	// to 5 s.
	CallGrace time.Duration
	// HealthInterval is how often Run checks each running plugin's health
	// and rescans Dir. Defaults to 30 s.
	HealthInterval time.Duration
	// HealthTimeout bounds Info and Health calls. A plugin that does not
	// answer Health in time is killed and restarted. Defaults to 5 s.
	HealthTimeout time.Duration
	// MinBackoff is the delay before restarting a plugin after its first
	// failure (an exit or a failed start); it doubles with each further
	// failure in a row, with up to 20% jitter, to MaxBackoff. Defaults to
	// 1 s.
	MinBackoff time.Duration
	// MaxBackoff caps the restart delay. Defaults to 1 min.
	MaxBackoff time.Duration
	// StableAfter is how long a plugin must have run before an exit no
	// longer counts as a failure in a row: its next restart waits
	// MinBackoff again. Defaults to 1 min.
	StableAfter time.Duration
	// Logger receives the host's records and the plugins' own log lines,
	// secrets scrubbed. Defaults to discarding them.
	Logger *slog.Logger
	// Clock is the time source. Defaults to the system clock.
	Clock Clock
}

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	c.Dir = cmp.Or(c.Dir, DefaultDir)
	if c.Env == nil {
		c.Env = []string{"PATH=" + cmp.Or(os.Getenv("PATH"), defaultPath)}
	}
	c.SocketDir = cmp.Or(c.SocketDir, os.TempDir())
	c.StartTimeout = cmp.Or(c.StartTimeout, 10*time.Second)
	c.CallTimeout = cmp.Or(c.CallTimeout, 2*time.Minute)
	c.CallGrace = cmp.Or(c.CallGrace, 5*time.Second)
	c.HealthInterval = cmp.Or(c.HealthInterval, 30*time.Second)
	c.HealthTimeout = cmp.Or(c.HealthTimeout, 5*time.Second)
	c.MinBackoff = cmp.Or(c.MinBackoff, time.Second)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, time.Minute)
	c.StableAfter = cmp.Or(c.StableAfter, time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	return c
}

func (c Config) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"StartTimeout", c.StartTimeout}, {"CallTimeout", c.CallTimeout}, {"CallGrace", c.CallGrace},
		{"HealthInterval", c.HealthInterval}, {"HealthTimeout", c.HealthTimeout},
		{"MinBackoff", c.MinBackoff}, {"MaxBackoff", c.MaxBackoff}, {"StableAfter", c.StableAfter},
	} {
		if d.v < 0 {
			return fmt.Errorf("plugin host config: %s is negative", d.name)
		}
	}
	if c.MaxBackoff < c.MinBackoff {
		return errors.New("plugin host config: MaxBackoff is below MinBackoff")
	}
	return nil
}

// Host runs bcd's plugins: it finds them, starts them, restarts them when
// they die, checks their health and carries calls to them. Its methods are
// safe for concurrent use. Calls start a plugin that is not running
// (waiting out its backoff within the call's deadline); Run also keeps every
// plugin running and checks its health between calls.
type Host struct {
	cfg     Config
	log     *slog.Logger
	clock   Clock
	secrets *secretSet

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu      sync.Mutex
	plugins map[string]*managed
	closed  bool

	// eager is set while Run is active: plugins are restarted without
	// waiting for a call. Atomic, not under mu: managed reads it holding its
	// own lock.
	eager atomic.Bool
}

// secretRetention is how long a call's password is still scrubbed from
// plugin log lines after the call ended.
const secretRetention = 5 * time.Minute

// New returns a Host for cfg and lists the plugin directory. It starts no
// plugin: calls and Run do. It fails for an invalid cfg or an unreadable
// (or world-writable) plugin directory.
func New(cfg Config) (*Host, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := &Host{
		cfg:     cfg,
		clock:   cfg.Clock,
		closing: make(chan struct{}),
		plugins: make(map[string]*managed),
	}
	h.secrets = newSecretSet(secretRetention, h.clock.Now)
	h.log = slog.New(RedactHandler(cfg.Logger.Handler(), h.secrets.list))
	if err := h.rescan(); err != nil {
		return nil, err
	}
	return h, nil
}

// rescan brings the plugin set in line with the directory: new executables
// are added (and started when Run is active), vanished ones stopped.
func (h *Host) rescan() error {
	list, skips, err := discover(h.cfg.Dir)
	if err != nil {
		return err
	}
	for _, s := range skips {
		h.log.Warn("Plugin refused", keyPath, s.path, logkey.Err, s.reason)
	}
	var added, removed []*managed
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	seen := make(map[string]bool, len(list))
	for _, f := range list {
		seen[f.name] = true
		if _, ok := h.plugins[f.name]; ok {
			continue
		}
		m := newManaged(h, f.name, f.path)
		h.plugins[f.name] = m
		added = append(added, m)
	}
	for name, m := range h.plugins {
		if !seen[name] {
			delete(h.plugins, name)
			removed = append(removed, m)
		}
	}
	h.mu.Unlock()
	for _, m := range added {
		h.log.Info("Plugin found", keyPlugin, m.name, keyPath, m.path)
		if h.eager.Load() {
			m.ensureStarted()
		}
	}
	for _, m := range removed {
		h.log.Info("Plugin removed", keyPlugin, m.name, keyPath, m.path)
		m.shutdown()
	}
	return nil
}

// Run keeps every plugin running until ctx ends: it starts them all,
// restarts those that exit (with backoff), checks each one's health every
// HealthInterval (killing and restarting one that does not answer) and picks
// up plugins added to or removed from the directory. When ctx ends it stops
// every plugin, like Close, and returns nil.
func (h *Host) Run(ctx context.Context) error {
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return ErrClosed
	}
	h.eager.Store(true)
	for _, m := range h.snapshot() {
		m.ensureStarted()
	}
	for {
		select {
		case <-ctx.Done():
			h.Close()
			return nil
		case <-h.closing:
			return nil
		case <-h.clock.After(h.cfg.HealthInterval):
		}
		if err := h.rescan(); err != nil {
			h.log.WarnContext(ctx, "Plugin directory unreadable", logkey.Err, err)
		}
		h.checkAll(ctx)
	}
}

// checkAll runs one health check of every running plugin, concurrently.
func (h *Host) checkAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, m := range h.snapshot() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.check(ctx)
		}()
	}
	wg.Wait()
}

// snapshot returns the managed plugins, sorted by name.
func (h *Host) snapshot() []*managed {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*managed, 0, len(h.plugins))
	for _, m := range h.plugins {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *managed) int { return cmp.Compare(a.name, b.name) })
	return out
}

// Close stops every plugin process and waits for them; later calls fail
// with ErrClosed. It is safe to call more than once.
func (h *Host) Close() {
	h.closeOnce.Do(func() {
		h.mu.Lock()
		h.closed = true
		h.eager.Store(false)
		ms := make([]*managed, 0, len(h.plugins))
		for _, m := range h.plugins {
			ms = append(ms, m)
		}
		h.mu.Unlock()
		close(h.closing)
		for _, m := range ms {
			m.shutdown()
		}
		h.wg.Wait()
	})
}

// spawn runs f on a goroutine Close waits for; after Close it runs f
// before returning. (A WaitGroup may not grow once Wait has begun.)
func (h *Host) spawn(f func()) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		f()
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		f()
	}()
}

// Status is what List reports about one plugin.
type Status struct {
	// Name is the plugin's name, without "bcx-".
	Name string
	// Path is the plugin's executable.
	Path string
	// Version is the version the plugin gave at its last start; empty
	// before it first started.
	Version string
	// Capabilities are what the plugin announced at its last start.
	Capabilities []string
	// Running reports a live plugin process.
	Running bool
	// Healthy reports a running plugin whose last health check (or start)
	// passed.
	Healthy bool
	// Message says why the plugin is unhealthy or not running, or what its
	// health check said; empty when there is nothing to say.
	Message string
	// PID is the plugin process's id while it runs, else 0.
	PID int
	// Starts counts the plugin's successful starts; more than one means it
	// was restarted.
	Starts int
	// Failures counts its failed starts and unexpected exits in a row.
	Failures int
	// StartedAt is when the running process started; zero when none runs.
	StartedAt time.Time
}

// List reports every plugin in the directory, sorted by name, for the node's
// inventory (sessionv1.PluginInfo: name, version, healthy, message).
func (h *Host) List() []Status {
	ms := h.snapshot()
	out := make([]Status, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.status())
	}
	return out
}

// Find returns the name of the first plugin, by name, that announced
// capability (CapabilityPower, ...) at its last start and is running or
// starting; false when none did.
func (h *Host) Find(capability string) (string, bool) {
	for _, m := range h.snapshot() {
		if m.can(capability) {
			return m.name, true
		}
	}
	return "", false
}

// plugin returns the managed plugin called name.
func (h *Host) plugin(name string) (*managed, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	m, ok := h.plugins[name]
	if !ok {
		return nil, ErrNotFound
	}
	return m, nil
}
