package plugin

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// managed is one plugin executable and the process running it, if any.
type managed struct {
	h    *Host
	name string
	path string

	mu        sync.Mutex
	inst      *instance     // the running process; nil when none
	starting  chan struct{} // closed when the start in progress ends; nil when none
	startErr  error         // why the last start failed; nil after a good one
	failures  int           // failed starts and unexpected exits in a row
	notBefore time.Time     // no start before this (backoff)
	starts    int
	info      *pluginv1.InfoResponse
	healthy   bool
	message   string
	stopped   bool // removed from the directory, or the host closed
}

// instance is one running plugin process.
type instance struct {
	health    *pluginv1.HealthResponse // its answer at start
	client    *goplugin.Client
	rpc       pluginv1.PluginServiceClient
	exited    <-chan struct{} // closed once the process has exited
	pid       int
	socketDir string
	startedAt time.Time

	stopping   atomic.Bool            // the host stopped it: its exit is expected
	killReason atomic.Pointer[string] // why the host killed it, as a failure
	killOnce   sync.Once
}

func newManaged(h *Host, name, path string) *managed {
	return &managed{h: h, name: name, path: path}
}

// get returns the running instance, starting one when none runs (after
// the backoff, within ctx). A failed start is returned at once.
func (m *managed) get(ctx context.Context) (*instance, error) {
	for {
		m.mu.Lock()
		if m.stopped {
			m.mu.Unlock()
			return nil, ErrClosed
		}
		if inst := m.inst; inst != nil {
			select {
			case <-inst.exited:
				m.exitedLocked(inst)
			default:
				m.mu.Unlock()
				return inst, nil
			}
		}
		ch := m.startLocked()
		m.mu.Unlock()

		select {
		case <-ch:
		case <-ctx.Done():
			m.mu.Lock()
			wait := m.notBefore.Sub(m.h.clock.Now())
			m.mu.Unlock()
			if wait > 0 {
				return nil, fmt.Errorf("%w: restarting after a failure, next start in %s", ErrUnavailable, wait.Round(time.Millisecond))
			}
			return nil, fmt.Errorf("%w: still starting: %w", ErrUnavailable, ctx.Err())
		}
		m.mu.Lock()
		inst, err := m.inst, m.startErr
		m.mu.Unlock()
		if inst == nil && err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
}

// ensureStarted starts the plugin (after its backoff) unless it runs or is
// starting. For Run, which keeps plugins up between calls.
func (m *managed) ensureStarted() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped || m.inst != nil {
		return
	}
	m.startLocked()
}

// startLocked returns the channel closed when the current start ends,
// launching one (after the backoff) when none is in progress. m.mu is held.
func (m *managed) startLocked() chan struct{} {
	if m.starting != nil {
		return m.starting
	}
	ch := make(chan struct{})
	m.starting = ch
	delay := m.notBefore.Sub(m.h.clock.Now())
	m.h.wg.Add(1)
	go func() {
		defer m.h.wg.Done()
		defer close(ch)
		if delay > 0 {
			select {
			case <-m.h.clock.After(delay):
			case <-m.h.closing:
				m.mu.Lock()
				m.starting = nil
				m.startErr = ErrClosed
				m.mu.Unlock()
				return
			}
		}
		inst, info, err := m.launch()
		m.mu.Lock()
		defer m.mu.Unlock()
		m.starting = nil
		if err == nil && m.stopped {
			inst.stopping.Store(true)
			m.h.spawn(inst.kill)
			err = ErrClosed
		}
		if err != nil {
			m.startErr = err
			if !errors.Is(err, ErrClosed) {
				m.failedLocked("start failed: " + err.Error())
			}
			return
		}
		m.inst, m.info, m.startErr = inst, info, nil
		m.starts++
		m.healthy, m.message = inst.health.GetHealthy(), m.h.secrets.scrub(inst.health.GetMessage())
		m.h.log.Info("Plugin started", keyPlugin, m.name, keyVersion, info.GetVersion(), keyPID, inst.pid)
		m.h.wg.Add(1)
		go func() {
			defer m.h.wg.Done()
			select {
			case <-inst.exited:
			case <-m.h.closing:
				return
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.inst == inst {
				m.exitedLocked(inst)
			}
		}()
	}()
	return ch
}

// failedLocked records a failure (a failed start or an unexpected exit):
// the plugin is unhealthy and waits out a longer backoff, and when Run is
// active a restart is scheduled. m.mu is held.
func (m *managed) failedLocked(why string) {
	m.failures++
	delay := backoff(m.h.cfg.MinBackoff, m.h.cfg.MaxBackoff, m.failures)
	m.notBefore = m.h.clock.Now().Add(delay)
	m.healthy = false
	m.message = m.h.secrets.scrub(why)
	m.h.log.Warn("Plugin failed", keyPlugin, m.name, logkey.Err, m.message, keyFailures, m.failures, keyRetryIn, delay)
	if m.h.eager.Load() && !m.stopped {
		m.startLocked()
	}
}

// exitedLocked handles the exit of inst, the current instance. m.mu is
// held.
func (m *managed) exitedLocked(inst *instance) {
	m.inst = nil
	m.h.spawn(inst.kill) // reap go-plugin's goroutines, remove the socket directory
	if inst.stopping.Load() {
		m.healthy, m.message = false, "stopped"
		return
	}
	why := "exited unexpectedly"
	if r := inst.killReason.Load(); r != nil {
		why = *r
	}
	if m.h.clock.Now().Sub(inst.startedAt) >= m.h.cfg.StableAfter {
		m.failures = 0
	}
	m.failedLocked(why)
}

// recycle kills inst because it stopped answering; its exit counts as a
// failure with reason why, and it is restarted like a crashed plugin.
func (m *managed) recycle(inst *instance, why string) {
	if inst.killReason.CompareAndSwap(nil, &why) {
		m.h.log.Warn("Plugin not answering, killing it", keyPlugin, m.name, keyPID, inst.pid, logkey.Err, why)
		m.h.spawn(inst.kill)
	}
}

// shutdown stops the plugin for good (removed, or the host closed) and waits
// for its process to exit.
func (m *managed) shutdown() {
	m.mu.Lock()
	m.stopped = true
	inst := m.inst
	m.inst = nil
	m.mu.Unlock()
	if inst != nil {
		inst.stopping.Store(true)
		inst.kill()
	}
}

// check runs one health check; a plugin that does not answer in time is
// recycled.
func (m *managed) check(ctx context.Context) {
	m.mu.Lock()
	inst := m.inst
	m.mu.Unlock()
	if inst == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, m.h.cfg.HealthTimeout)
	defer cancel()
	resp, err := inst.rpc.Health(cctx, &pluginv1.HealthRequest{})
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inst != inst {
		return
	}
	switch {
	case err == nil:
		m.healthy, m.message = resp.GetHealthy(), m.h.secrets.scrub(resp.GetMessage())
	case ctx.Err() != nil:
		// The host is stopping; say nothing.
	default:
		select {
		case <-inst.exited:
			m.exitedLocked(inst)
			return
		default:
		}
		m.healthy, m.message = false, "health check failed: "+m.h.secrets.scrub(err.Error())
		if cctx.Err() != nil {
			m.recycle(inst, fmt.Sprintf("no answer to a health check within %s", m.h.cfg.HealthTimeout))
		}
	}
}

func (m *managed) status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Status{
		Name:     m.name,
		Path:     m.path,
		Healthy:  m.healthy,
		Message:  m.message,
		Starts:   m.starts,
		Failures: m.failures,
	}
	if m.info != nil {
		s.Version = m.info.GetVersion()
		s.Capabilities = slices.Clone(m.info.GetCapabilities())
	}
	if inst := m.inst; inst != nil {
		s.Running = true
		s.PID = inst.pid
		s.StartedAt = inst.startedAt
	} else {
		s.Healthy = false
		if s.Message == "" {
			s.Message = "not started"
		}
	}
	return s
}

// can reports whether the plugin announced capability and is not stopped.
func (m *managed) can(capability string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.stopped && m.info != nil && slices.Contains(m.info.GetCapabilities(), capability)
}

// launch starts a plugin process and asks its Info.
func (m *managed) launch() (*instance, *pluginv1.InfoResponse, error) {
	cfg := m.h.cfg
	sockDir, err := os.MkdirTemp(cfg.SocketDir, ExecPrefix+m.name+"-")
	if err != nil {
		return nil, nil, fmt.Errorf("create socket directory: %w", err)
	}
	cmd := exec.Command(m.path)
	cmd.Env = append(slices.Clone(cfg.Env),
		// go-plugin's plugin side creates its socket here (mode 0700).
		"PLUGIN_UNIX_SOCKET_DIR="+sockDir)
	setProcAttr(cmd)
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: versionedPlugins(nil),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     cfg.StartTimeout,
		SkipHostEnv:      true,
		Logger:           newHCLogger(m.h.log.With(keyPlugin, m.name), m.h.secrets.scrub),
	})
	fail := func(err error) (*instance, *pluginv1.InfoResponse, error) {
		client.Kill()
		_ = os.RemoveAll(sockDir)
		return nil, nil, err
	}
	proto, err := client.Client()
	if err != nil {
		return fail(fmt.Errorf("start %s: %s", m.path, startFailure(err)))
	}
	raw, err := proto.Dispense(pluginSetKey)
	if err != nil {
		return fail(fmt.Errorf("start %s: %w", m.path, err))
	}
	c, ok := raw.(*conn)
	if !ok {
		return fail(fmt.Errorf("start %s: unexpected plugin client %T", m.path, raw))
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.HealthTimeout)
	defer cancel()
	info, err := c.rpc.Info(ctx, &pluginv1.InfoRequest{})
	if err != nil {
		return fail(fmt.Errorf("start %s: info: %w", m.path, err))
	}
	health, err := c.rpc.Health(ctx, &pluginv1.HealthRequest{})
	if err != nil {
		return fail(fmt.Errorf("start %s: health: %w", m.path, err))
	}
	if info.GetName() != m.name {
		m.h.log.Warn("Plugin calls itself by another name", keyPlugin, m.name, "says", info.GetName())
	}
	inst := &instance{
		health:    health,
		client:    client,
		rpc:       c.rpc,
		exited:    c.exited,
		socketDir: sockDir,
		startedAt: m.h.clock.Now(),
	}
	if rc := client.ReattachConfig(); rc != nil {
		inst.pid = rc.Pid
	}
	return inst, info, nil
}

// startFailure makes go-plugin's start error one line: its "Unrecognized
// remote plugin message" comes with a paragraph of advice.
func startFailure(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	if strings.HasPrefix(msg, "Unrecognized remote plugin message") {
		return "no go-plugin handshake on its stdout: it exited at once, is not a bcd plugin, or is built for another architecture"
	}
	return msg
}

// kill stops the process (asking first, then SIGKILL after go-plugin's 2 s),
// kills what is left of its process group and removes its socket directory.
// Safe to call more than once.
func (i *instance) kill() {
	i.killOnce.Do(func() {
		i.client.Kill()
		killGroup(i.pid)
		_ = os.RemoveAll(i.socketDir)
	})
}

// backoff is the restart delay after n failures in a row: lo doubled n-1
// times, capped at hi, plus up to 20% jitter.
func backoff(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	if j := int64(d / 5); j > 0 {
		d += time.Duration(rand.Int64N(j))
	}
	return d
}
