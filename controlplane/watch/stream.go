package watch

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// hub watches the store for changes the page shows, once for every open
// stream of the process: while at least one stream is subscribed it reads,
// every interval, the newest outbox id and the node and command counts
// (three small queries), and wakes every subscriber when their fingerprint
// changed. The outbox alone would do once every state change writes an
// event (issue 18, item 1); the counts also catch the changes that write
// none.
type hub struct {
	st       Store
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	subs    map[chan int64]struct{}
	running bool
	last    uint64 // fingerprint of the last read
	lastID  int64  // outbox id of the last read
}

func newHub(st Store, interval time.Duration, log *slog.Logger) *hub {
	return &hub{st: st, interval: interval, log: log, subs: map[chan int64]struct{}{}}
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
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for range t.C {
		h.mu.Lock()
		if len(h.subs) == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		fp, id, err := h.fingerprint(ctx)
		cancel()
		if err != nil {
			h.log.Warn("Fleet page change poll failed", logkey.Err, err)
			continue
		}
		h.mu.Lock()
		if fp != h.last {
			h.last, h.lastID = fp, id
			for ch := range h.subs {
				select {
				case ch <- id:
				default: // one pending wake-up is enough
				}
			}
		}
		h.mu.Unlock()
	}
}

// fingerprint hashes what the page's live part depends on, but for GPU
// health (in inventories; reported as events, which move the outbox id).
func (h *hub) fingerprint(ctx context.Context) (uint64, int64, error) {
	id, err := h.st.OutboxMaxID(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox max id: %w", err)
	}
	counts, err := h.st.NodeCounts(ctx)
	if err != nil {
		return 0, 0, err
	}
	open, err := h.st.CommandCountOpen(ctx)
	if err != nil {
		return 0, 0, err
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
	return f.Sum64(), id, nil
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
