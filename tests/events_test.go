package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// cutProxy forwards TCP connections to target until cut closes every
// connection it holds: a dropped connection, as a load balancer restart or
// a network blip makes one.
type cutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns []net.Conn
	cuts  int
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

// cut closes every connection held now.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.cuts++
}

// TestEventStreamResume, on both backends: a real serve, real HTTP. The
// CLI's events watch -o json runs through a proxy whose connections the
// test cuts twice while events keep being written; it prints every event
// written after it started exactly once, in outbox order (it resumes with
// Last-Event-ID), as events.list lists them. A raw stream resumed with
// Last-Event-ID from the middle gives exactly the events after that id,
// and one resumed with ?after= too.
func TestEventStreamResume(t *testing.T) {
	t.Parallel()
	for _, b := range fleetBackends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			testEventStreamResume(t, b)
		})
	}
}

func testEventStreamResume(t *testing.T, backendName string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := newDeployment(t, backendName)
	admin := &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}
	// Every tokens.create writes one event (com.better-compute.token.created).
	write := func(n int) {
		t.Helper()
		for range n {
			if _, err := admin.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: "viewer", Description: "events e2e"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	viewer, err := admin.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: "viewer", Description: "events watcher"})
	if err != nil {
		t.Fatal(err)
	}
	start := newestEventID(ctx, t, admin)

	proxy := newCutProxy(t, strings.TrimPrefix(d.api, "http://"))
	watch := testenv.Start(t, append(d.env, "BETTER_COMPUTE_TOKEN="+viewer.Token), d.bc, "events", "watch",
		"--server", "http://"+proxy.ln.Addr().String(), "--after", strconv.FormatInt(start, 10), "-o", "json")
	write(5)
	watch.WaitLine(`"type":"com\.better-compute\.token\.created"`, 30*time.Second)
	for i := range 2 {
		proxy.cut()
		write(7) // written while the watcher is cut off or reconnecting
		last := newestEventID(ctx, t, admin)
		// It noticed, reconnected and caught up before the next cut.
		eventually(t, 30*time.Second, func() bool {
			ids := watchedIDs(t, watch.Output())
			return strings.Count(watch.Output(), "connection lost") > i && len(ids) > 0 && ids[len(ids)-1] == last
		}, func() string {
			return fmt.Sprintf("events watch did not resume to event %d after cut %d:\n%s", last, i+1, watch.Output())
		})
	}
	write(3)
	want := eventIDsAfter(ctx, t, admin, start)
	if len(want) < 5+14+3 {
		t.Fatalf("events.list has %d events after %d, want at least %d", len(want), start, 5+14+3)
	}
	var got []int64
	eventually(t, 30*time.Second, func() bool {
		got = watchedIDs(t, watch.Output())
		return len(got) >= len(want)
	}, func() string {
		return fmt.Sprintf("watch printed %d events, events.list has %d:\n%s", len(got), len(want), watch.Output())
	})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("watch printed ids\n%v\nevents.list (oldest first) has\n%v", got, want)
	}

	// Raw HTTP: resume from the middle with Last-Event-ID, then with ?after=.
	mid := want[len(want)/2]
	for _, resume := range []struct{ query, header string }{{"", strconv.FormatInt(mid, 10)}, {"?after=" + strconv.FormatInt(mid, 10), ""}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.api+"/api/events/watch"+resume.query, nil)
		req.Header.Set("Authorization", "Bearer "+viewer.Token)
		if resume.header != "" {
			req.Header.Set("Last-Event-ID", resume.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		sc := bufio.NewScanner(resp.Body)
		for len(ids) < len(want)-len(want)/2-1 && sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
				n, _ := strconv.ParseInt(id, 10, 64)
				ids = append(ids, n)
			}
		}
		resp.Body.Close()
		if fmt.Sprint(ids) != fmt.Sprint(want[len(want)/2+1:]) {
			t.Fatalf("resumed after %d (%+v): ids %v, want %v", mid, resume, ids, want[len(want)/2+1:])
		}
	}
	watch.Stop(2, 10*time.Second) // SIGINT
}

// newestEventID is the id of the newest event events.list has.
func newestEventID(ctx context.Context, t *testing.T, c *client.Client) int64 {
	t.Helper()
	resp, err := c.EventsList(ctx, &apiv1.ListEventsRequest{Page: &apiv1.Page{Limit: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Events) == 0 {
		return 0
	}
	n, _ := strconv.ParseInt(resp.Events[0].Id, 10, 64)
	return n
}

// eventIDsAfter lists, oldest first, the ids events.list has after id.
func eventIDsAfter(ctx context.Context, t *testing.T, c *client.Client, after int64) []int64 {
	t.Helper()
	var ids []int64
	cursor := ""
	for {
		resp, err := c.EventsList(ctx, &apiv1.ListEventsRequest{Page: &apiv1.Page{Cursor: cursor, Limit: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		done := resp.NextCursor == ""
		for _, e := range resp.Events {
			n, _ := strconv.ParseInt(e.Id, 10, 64)
			if n <= after {
				done = true
				break
			}
			ids = append([]int64{n}, ids...)
		}
		if done {
			return ids
		}
		cursor = resp.NextCursor
	}
}

// watchedIDs are the ids of the JSON lines events watch -o json printed.
func watchedIDs(t *testing.T, out string) []int64 {
	t.Helper()
	var ids []int64
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var e struct {
			ID         string         `json:"id"`
			Type       string         `json:"type"`
			CloudEvent map[string]any `json:"cloudEvent"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events watch printed %q: %v", line, err)
		}
		if e.CloudEvent["specversion"] != "1.0" || e.CloudEvent["type"] != e.Type {
			t.Fatalf("events watch printed %q: not an event with its CloudEvents envelope", line)
		}
		n, err := strconv.ParseInt(e.ID, 10, 64)
		if err != nil {
			t.Fatalf("events watch printed id %q", e.ID)
		}
		ids = append(ids, n)
	}
	return ids
}
