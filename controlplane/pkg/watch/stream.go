package watch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/feed"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// hub watches for changes the page shows, once for every open stream of
// the process: while at least one stream is subscribed it follows the
// process's event feed (package feed, the api's one outbox reader) and
// wakes every subscriber after each new event; after an event, and every
// interval without one, it also reads the node and command counts (two
// small grouped queries) and wakes the subscribers when they changed,
// which catches the changes that write no event (a command dispatched or
// running).
type hub struct {
	st       Store
	feed     *feed.Feed
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	subs    map[chan int64]struct{}
	running bool
	last    uint64 // fingerprint of the last look
}

func newHub(st Store, f *feed.Feed, interval time.Duration, log *slog.Logger) *hub {
	return &hub{st: st, feed: f, interval: interval, log: log, subs: map[chan int64]struct{}{}}
}

// subscribe returns a channel that receives the newest outbox id after
// each change (at most one pending), and the function that ends the
// subscription. The first subscriber starts the hub's loop; it stops after
// the last one leaves.
func (h *hub) subscribe() (<-chan int64, func()) {
	ch := make(chan int64, 1)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	if !h.running {
		h.running = true
		go h.run()
	}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}

func (h *hub) run() {
	ctx := context.Background()
	cursor, _ := h.feed.Head(ctx) // only a cancelled ctx fails Head
	for {
		h.mu.Lock()
		if len(h.subs) == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		read, cancel := context.WithTimeout(ctx, 5*time.Second)
		fp, err := h.fingerprint(read, cursor)
		cancel()
		h.mu.Lock()
		if err != nil {
			h.log.Warn("Fleet page change poll failed", logkey.Err, err)
		} else if fp != h.last {
			h.last = fp
			for ch := range h.subs {
				select {
				case ch <- cursor:
				default: // one pending wake-up is enough
				}
			}
		}
		h.mu.Unlock()
		wait, cancel := context.WithTimeout(ctx, h.interval)
		evs, err := h.feed.Next(wait, cursor, 1000)
		cancel()
		var gap *feed.GapError
		switch {
		case errors.As(err, &gap): // fell behind retention: from now on
			cursor, _ = h.feed.Head(ctx)
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			h.log.Warn("Fleet page cannot follow the event feed", logkey.Err, err)
			time.Sleep(h.interval)
		case len(evs) > 0:
			cursor = evs[len(evs)-1].ID
		}
	}
}

// fingerprint hashes what the page's live part depends on: the newest
// event id (id) and the node and command counts. GPU health is in
// inventories; its changes are events, which move id.
func (h *hub) fingerprint(ctx context.Context, id int64) (uint64, error) {
	counts, err := h.st.NodeCounts(ctx)
	if err != nil {
		return 0, err
	}
	open, err := h.st.CommandCountOpen(ctx)
	if err != nil {
		return 0, err
	}
	f := fnv.New64a()
	fmt.Fprintf(f, "%d|", id)
	for _, c := range counts {
		fmt.Fprintf(f, "%s/%s/%d/%d|", c.SiteID, c.State, c.Nodes, c.Cordoned)
	}
	states := make([]string, 0, len(open))
	for s := range open {
		states = append(states, s)
	}
	sort.Strings(states)
	for _, s := range states {
		fmt.Fprintf(f, "%s=%d|", s, open[s])
	}
	return f.Sum64(), nil
}

// streamTenantStopped reports whether the tenant of the session s's token
// is stopped (or the token gone); a failed read keeps the stream (the
// page's own reads fail on their own).
func (h *Handler) streamTenantStopped(ctx context.Context, s *session) bool {
	t, err := h.store.APITokenBySecret(ctx, s.tokenHash)
	if errors.Is(err, store.ErrNotFound) {
		return true
	}
	if err != nil {
		h.log.WarnContext(ctx, "Page stream token check failed", logkey.Err, err)
		return false
	}
	stopped, err := h.tenantStopped(ctx, s, t)
	if err != nil {
		h.log.WarnContext(ctx, "Page stream token check failed", logkey.Err, err)
	}
	return stopped
}

// events is the page's event stream (Server-Sent Events, authorised by the
// page cookie, which a browser's EventSource sends): an event "change"
// with the newest outbox id as its id and data after every change, and a
// comment every KeepAlive. It ends when the session does (logout, expiry)
// or the client goes.
func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	s, id := h.current(r)
	if s == nil {
		http.Error(w, "no page session", http.StatusUnauthorized)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	// The time of the session's last tenant check, read before the client
	// sees the stream open: a clock that moves once it has (a test's fake
	// one) is always counted from here.
	checked := h.now()
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "retry: 2000\n\n")
	flusher.Flush()
	changes, stop := h.hub.subscribe()
	defer stop()
	keep := time.NewTicker(h.cfg.KeepAlive)
	defer keep.Stop()
	check := time.NewTicker(time.Second)
	defer check.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-check.C:
			// A tenant's session: its tenant re-read every
			// iam.DefaultStoppedRefresh, as its requests do.
			if s.within != "" && h.now().Sub(checked) >= iam.DefaultStoppedRefresh {
				checked = h.now()
				if h.streamTenantStopped(r.Context(), s) {
					h.sessions.end(id)
				}
			}
			if !h.sessions.live(id) {
				fmt.Fprintf(w, "event: ended\ndata: {}\n\n")
				flusher.Flush()
				return
			}
		case <-keep.C:
			fmt.Fprintf(w, ": keep-alive\n\n")
			flusher.Flush()
		case outboxID := <-changes:
			fmt.Fprintf(w, "id: %d\nevent: change\ndata: {\"outboxId\":%d}\n\n", outboxID, outboxID)
			flusher.Flush()
		}
	}
}
