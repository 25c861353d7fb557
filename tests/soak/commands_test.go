package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// commandTimeout is every command's deadline, from creation.
const commandTimeout = 60 * time.Second

// appendScript is the real nodes' command: it appends its first argument,
// the command's idempotency key, as one line to the file named by its
// second, then stays running a moment, so that faults catch commands
// mid-run.
const appendScript = `echo "$0" >> "$1"; sleep 1`

// intent is one commands.create request: its idempotency key, its targets,
// and what the API answered once a call succeeded.
type intent struct {
	key   string
	nodes []string
	ids   []string // command ids, once created
	calls int
}

// commandStream creates commands through the API at a steady rate: one
// loop for the real nodes (one node each, appendScript), one for the
// FakeDaemons (one or two nodes each). A failed call (the API killed or
// stopped) is retried with the same idempotency key until it succeeds or
// the stream stops.
type commandStream struct {
	c *client.Client
	f *fleet

	mu       sync.Mutex
	intents  []*intent
	failures int    // calls that failed
	lastErr  string // the latest failure

	cancel context.CancelFunc
	done   sync.WaitGroup
}

// startCommands starts both loops: a real node's command every realEvery,
// a FakeDaemon command every fakeEvery.
func startCommands(cp *controlPlane, f *fleet, realEvery, fakeEvery time.Duration) *commandStream {
	ctx, cancel := context.WithCancel(context.Background())
	s := &commandStream{c: &client.Client{BaseURL: cp.api.url, Token: cp.token, HTTP: &http.Client{Timeout: 10 * time.Second}},
		f: f, cancel: cancel}
	n := 0
	s.done.Go(func() {
		s.loop(ctx, realEvery, func() (*intent, *apiv1.ExecSpec) {
			nodes := f.realNodes()
			node := nodes[rand.IntN(len(nodes))]
			n++
			key := fmt.Sprintf("soak-r-%06d", n)
			return &intent{key: key, nodes: []string{node.id}},
				&apiv1.ExecSpec{Argv: []string{"sh", "-c", appendScript, key, node.file}}
		})
	})
	m := 0
	s.done.Go(func() {
		fakes := f.fakeIDs()
		s.loop(ctx, fakeEvery, func() (*intent, *apiv1.ExecSpec) {
			var nodes []string
			for range 1 + rand.IntN(2) {
				nodes = append(nodes, fakes[rand.IntN(len(fakes))])
			}
			m++
			key := fmt.Sprintf("soak-f-%06d", m)
			return &intent{key: key, nodes: slices.Compact(slices.Sorted(slices.Values(nodes)))},
				&apiv1.ExecSpec{Argv: []string{"echo", key}}
		})
	})
	return s
}

// loop makes one intent every interval and calls until it is created.
func (s *commandStream) loop(ctx context.Context, interval time.Duration, next func() (*intent, *apiv1.ExecSpec)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		in, spec := next()
		s.mu.Lock()
		s.intents = append(s.intents, in)
		s.mu.Unlock()
		req := &apiv1.CreateCommandsRequest{NodeIds: in.nodes, Kind: "exec", Exec: spec,
			Timeout: durationpb.New(commandTimeout), IdempotencyKey: in.key}
		for ctx.Err() == nil {
			resp := &apiv1.CreateCommandsResponse{}
			err := s.c.Call(ctx, "commands.create", req, resp)
			s.mu.Lock()
			in.calls++
			if err == nil {
				for _, c := range resp.GetCommands() {
					in.ids = append(in.ids, c.GetId())
				}
				s.mu.Unlock()
				break
			}
			if ctx.Err() == nil {
				s.failures++
				s.lastErr = err.Error()
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
}

// stop stops both loops and returns every intent.
func (s *commandStream) stop() []*intent {
	s.cancel()
	s.done.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.intents)
}

// stats returns the intents made so far, those created, and the failed
// calls.
func (s *commandStream) stats() (intents, created, failures int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range s.intents {
		if len(in.ids) > 0 {
			created++
		}
	}
	return len(s.intents), created, s.failures
}

// healthy reports whether the API at apiURL (with its base path) answers
// /healthz.
func healthy(ctx context.Context, apiURL string) bool {
	base := strings.TrimSuffix(apiURL, "/api")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
	if err != nil {
		return false
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}
