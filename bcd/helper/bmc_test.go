package helper_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/bmc"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/proto/bmcsecret"
)

// fakeBMC answers BMC calls from the test.
type fakeBMC struct {
	got chan *bmc.Request
	do  func(ctx context.Context, req *bmc.Request) (*bmc.Result, error)
}

func (f *fakeBMC) Do(ctx context.Context, req *bmc.Request) (*bmc.Result, error) {
	f.got <- req
	return f.do(ctx, req)
}

func startBMCHelper(t *testing.T, runner helper.BMCRunner) *helper.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "helper.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := helper.NewServer(helper.Config{Socket: sock, NodeUID: uint32(os.Getuid()), NodeGID: uint32(os.Getgid()), BMC: runner},
		slog.New(slog.DiscardHandler))
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	c := &helper.Client{Socket: sock}
	for deadline := time.Now().Add(5 * time.Second); c.Ping(context.Background()) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("helper never answered")
		}
	}
	return c
}

func TestBMCThroughHelper(t *testing.T) {
	f := &fakeBMC{got: make(chan *bmc.Request, 4)}
	c := startBMCHelper(t, f)
	ctx := context.Background()

	f.do = func(_ context.Context, req *bmc.Request) (*bmc.Result, error) {
		return &bmc.Result{BMC: req.Credentials.Address, Action: req.Action, Power: bmc.PowerOff, Provider: "ipmitool", Source: bmc.SourceSecret}, nil
	}
	creds := &bmcsecret.Credentials{Address: "10.0.0.9", Username: "u", Password: "pw-in-transit"}
	res, err := c.BMC(ctx, &bmc.Request{Action: bmc.ActionOff, Credentials: creds})
	if err != nil || res.Power != bmc.PowerOff || res.BMC != "10.0.0.9" {
		t.Fatalf("off: %+v %v", res, err)
	}
	if got := <-f.got; got.Credentials == nil || got.Credentials.Password != "pw-in-transit" {
		t.Fatalf("the helper got %+v", got)
	}

	// A failure keeps its result (the reason) and its message.
	f.do = func(_ context.Context, req *bmc.Request) (*bmc.Result, error) {
		return &bmc.Result{BMC: "10.1.1.1", Name: req.BMC, Action: req.Action, Reason: "AUTH_FAILED"},
			errors.New("bmc rack1: wrong user name or password")
	}
	res, err = c.BMC(ctx, &bmc.Request{Action: bmc.ActionStatus, BMC: "rack1"})
	<-f.got
	if err == nil || err.Error() != "bmc rack1: wrong user name or password" || res == nil || res.Reason != "AUTH_FAILED" {
		t.Fatalf("failure: %+v %v", res, err)
	}

	// Closing the connection cancels the call in the helper.
	cancelled := make(chan struct{})
	f.do = func(ctx context.Context, req *bmc.Request) (*bmc.Result, error) {
		<-ctx.Done()
		close(cancelled)
		return &bmc.Result{Action: req.Action, Reason: bmc.ReasonCancelled}, ctx.Err()
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := c.BMC(cctx, &bmc.Request{Action: bmc.ActionStatus}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled call: %v", err)
	}
	<-f.got
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the helper's call was not cancelled")
	}
}

func TestBMCRefusedWithoutController(t *testing.T) {
	c := startBMCHelper(t, nil)
	_, err := c.BMC(context.Background(), &bmc.Request{Action: bmc.ActionStatus})
	if err == nil || !strings.Contains(err.Error(), "does not run BMC calls") {
		t.Fatalf("bmc on a helper without a controller: %v", err)
	}
}
