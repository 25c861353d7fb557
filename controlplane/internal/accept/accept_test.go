package accept

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// flaky is a listener whose Accept fails with errs first, then accepts
// from the real one.
type flaky struct {
	net.Listener
	mu   sync.Mutex
	errs []error
}

func (f *flaky) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	return f.Listener.Accept()
}

type counter struct{ n atomic.Int64 }

func (c *counter) AcceptError(string) { c.n.Add(1) }

func emfile() error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

func TestAcceptBacksOffOnTemporaryErrors(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var m counter
	w := NewWatch(Config{Metrics: &m})
	f := &flaky{Listener: raw, errs: []error{emfile(), emfile(), emfile()}}
	ln := w.Wrap("test", f)
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", raw.Addr().String()); err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	start := time.Now()
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept after three EMFILE: %v", err)
	}
	c.Close()
	// 5 + 10 + 20 ms of back-off at least.
	if d := time.Since(start); d < 35*time.Millisecond {
		t.Fatalf("Accept returned after %s: want the back-off of 35 ms at least", d)
	}
	if m.n.Load() != 3 {
		t.Fatalf("counted %d failed accepts, want 3", m.n.Load())
	}
	if err := w.Check(); err != nil {
		t.Fatalf("Check after the listener recovered: %v", err)
	}
}

func TestCheckReportsALongEpisode(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	w := NewWatch(Config{Now: clock})
	errs := make([]error, 1000)
	for i := range errs {
		errs[i] = emfile()
	}
	ln := w.Wrap("gateway", &flaky{Listener: raw, errs: errs})
	returned := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		returned <- err
	}()
	// Wait for the episode to start.
	for deadline := time.Now().Add(10 * time.Second); ; {
		ln.mu.Lock()
		started := !ln.failingSince.IsZero()
		ln.mu.Unlock()
		if started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no failed accept recorded")
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()
	if err := w.Check(); err != nil {
		t.Fatalf("Check at 10 s: %v, want nil (more than 10 s is unready)", err)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	err = w.Check()
	if err == nil || !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("Check at 11 s = %v, want the listener named with EMFILE", err)
	}
	ln.Close()
	select {
	case err := <-returned:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return after Close during its back-off")
	}
	if err := w.Check(); err != nil {
		t.Fatalf("Check after Close: %v (a closed listener leaves the watch)", err)
	}
}

func TestAcceptReturnsOtherErrors(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	boom := errors.New("boom")
	ln := (*Watch)(nil).Wrap("x", &flaky{Listener: raw, errs: []error{boom}})
	if _, err := ln.Accept(); !errors.Is(err, boom) {
		t.Fatalf("Accept = %v, want the error that is not temporary", err)
	}
}
