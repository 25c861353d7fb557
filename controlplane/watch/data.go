package watch

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/inventory"
	"github.com/better-compute/better-compute/controlplane/store"
)

// nodeStates are the node states the page knows, in the order it shows
// them; a state not among them is shown after them.
var nodeStates = []string{store.NodeReady, store.NodeJoined, store.NodeUnreachable, store.NodePoweredOff, store.NodeDraining, store.NodeClockSkewed}

// openCommandStates are the command states counted as in flight.
var openCommandStates = []string{store.CommandQueued, store.CommandDispatched, store.CommandAccepted, store.CommandRunning}

// view is what the page template renders.
type view struct {
	Generated time.Time
	// States are the columns of the state × site table.
	States []string
	Sites  []siteRow
	Totals siteRow
	// GPUs by health, GPUHealth in the order shown.
	GPUs      []countRow
	GPUsTotal int
	GPUsAt    time.Time
	Commands  []countRow
	InFlight  int
	Events    []eventRow
	// Rollouts are the rollouts in progress or halted (rollouts.go).
	Rollouts []rolloutRow
	// The node list: Filter is the state shown ("" all), Nodes one page,
	// Next the cursor of the next page ("" none), Cursor this page's.
	Filter  string
	Cursor  string
	Nodes   []nodeRow
	Next    string
	Matches int // nodes in Filter (all nodes when Filter is "")
	PageSz  int
	// CSRF is the logout form's token.
	CSRF string
}

type siteRow struct {
	Name   string
	Counts []int // by view.States
	Total  int
}

type countRow struct {
	Name  string
	Count int
}

type eventRow struct {
	ID      int64
	Time    time.Time
	Type    string
	Subject string
}

type nodeRow struct {
	ID, Hostname, State, Site, Pool, Version string
	Cordoned                                 bool
	GPUs                                     int
	GPUIssues                                int // GPUs not ok
	LastSeen                                 *time.Time
}

// places maps pools to names and sites, read once a render (pools and
// sites are few).
type places struct {
	siteName map[string]string // site id -> name
	poolName map[string]string // pool id -> name
	poolSite map[string]string // pool id -> site id
}

func (h *Handler) places(ctx context.Context) (*places, error) {
	p := &places{siteName: map[string]string{}, poolName: map[string]string{}, poolSite: map[string]string{}}
	for lp := (store.ListParams{Limit: store.MaxListLimit}); ; {
		sites, err := h.store.SiteList(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("list sites: %w", err)
		}
		for _, s := range sites {
			p.siteName[s.ID] = s.Name
		}
		if len(sites) < lp.Limit {
			break
		}
		lp.Cursor = sites[len(sites)-1].ID
	}
	for lp := (store.ListParams{Limit: store.MaxListLimit}); ; {
		pools, err := h.store.PoolList(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("list pools: %w", err)
		}
		for _, pl := range pools {
			p.poolName[pl.ID] = pl.Name
			p.poolSite[pl.ID] = pl.SiteID
		}
		if len(pools) < lp.Limit {
			break
		}
		lp.Cursor = pools[len(pools)-1].ID
	}
	return p, nil
}

func (p *places) site(id string) string { return cmp.Or(p.siteName[id], id, "(no site)") }

// load reads the page's data: counts, GPU totals (cached), commands in
// flight, the latest events and one page of nodes in state filter after
// cursor.
func (h *Handler) load(ctx context.Context, filter, cursor string) (*view, error) {
	pl, err := h.places(ctx)
	if err != nil {
		return nil, err
	}
	counts, err := h.store.NodeCounts(ctx)
	if err != nil {
		return nil, fmt.Errorf("count nodes: %w", err)
	}
	v := &view{Generated: h.now().UTC(), Filter: filter, Cursor: cursor, PageSz: h.cfg.PageSize}
	states := slices.Clone(nodeStates)
	for _, c := range counts {
		if !slices.Contains(states, c.State) {
			states = append(states, c.State)
		}
	}
	v.States = states
	bySite := map[string]*siteRow{}
	var siteOrder []string
	v.Totals = siteRow{Name: "all sites", Counts: make([]int, len(states))}
	for _, c := range counts {
		name := pl.site(c.SiteID)
		row := bySite[name]
		if row == nil {
			row = &siteRow{Name: name, Counts: make([]int, len(states))}
			bySite[name] = row
			siteOrder = append(siteOrder, name)
		}
		i := slices.Index(states, c.State)
		row.Counts[i] += c.Nodes
		row.Total += c.Nodes
		v.Totals.Counts[i] += c.Nodes
		v.Totals.Total += c.Nodes
		if filter == "" || filter == c.State {
			v.Matches += c.Nodes
		}
	}
	slices.Sort(siteOrder)
	for _, name := range siteOrder {
		v.Sites = append(v.Sites, *bySite[name])
	}

	gpus, err := h.gpuTotals(ctx)
	if err != nil {
		return nil, err
	}
	v.GPUsAt = gpus.at
	for _, name := range slices.Sorted(maps.Keys(gpus.byHealth)) {
		v.GPUs = append(v.GPUs, countRow{Name: name, Count: gpus.byHealth[name]})
		v.GPUsTotal += gpus.byHealth[name]
	}
	open, err := h.store.CommandCountOpen(ctx)
	if err != nil {
		return nil, fmt.Errorf("count commands: %w", err)
	}
	for _, s := range openCommandStates {
		v.Commands = append(v.Commands, countRow{Name: s, Count: open[s]})
		v.InFlight += open[s]
	}
	if v.Events, err = h.latestEvents(ctx); err != nil {
		return nil, err
	}
	if v.Rollouts, err = h.rollouts(ctx, pl); err != nil {
		return nil, err
	}

	nodes, err := h.store.NodeList(ctx, &store.NodeListParams{ListParams: store.ListParams{Cursor: cursor, Limit: h.cfg.PageSize + 1}, State: filter})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	if len(nodes) > h.cfg.PageSize {
		nodes = nodes[:h.cfg.PageSize]
		v.Next = nodes[len(nodes)-1].ID
	}
	for _, n := range nodes {
		row := nodeRow{ID: n.ID, Hostname: n.Hostname, State: n.State, Cordoned: n.Cordoned, Version: n.BCDVersion,
			Site: pl.site(pl.poolSite[n.PoolID]), Pool: cmp.Or(pl.poolName[n.PoolID], n.PoolID), LastSeen: n.LastSeenAt}
		for _, g := range inventory.Decode(n.Inventory).GetGpus() {
			row.GPUs++
			if inventory.HealthName(g.GetHealth()) != "ok" {
				row.GPUIssues++
			}
		}
		v.Nodes = append(v.Nodes, row)
	}
	return v, nil
}

// latestEvents returns the newest Config.Events outbox entries, newest
// first. Their payload is a CloudEvents 1.0 envelope (package events);
// an entry that is not one shows its outbox topic and key.
func (h *Handler) latestEvents(ctx context.Context) ([]eventRow, error) {
	maxID, err := h.store.OutboxMaxID(ctx)
	if err != nil {
		return nil, fmt.Errorf("latest events: %w", err)
	}
	if maxID == 0 {
		return nil, nil
	}
	// Ids rise by one per entry on both backends, so the newest n lie
	// after maxID-n, give or take a rolled-back insert.
	entries, err := h.store.OutboxList(ctx, max(0, maxID-int64(h.cfg.Events)), h.cfg.Events)
	if err != nil {
		return nil, fmt.Errorf("latest events: %w", err)
	}
	out := make([]eventRow, 0, len(entries))
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		row := eventRow{ID: e.ID, Time: e.CreatedAt, Type: e.Topic, Subject: e.Key}
		var ce struct {
			Type    string    `json:"type"`
			Subject string    `json:"subject"`
			Time    time.Time `json:"time"`
		}
		if json.Unmarshal(e.Payload, &ce) == nil && ce.Type != "" {
			row.Type, row.Subject = ce.Type, cmp.Or(ce.Subject, e.Key)
			if !ce.Time.IsZero() {
				row.Time = ce.Time
			}
		}
		out = append(out, row)
	}
	return out, nil
}

// gpuCounts are the GPUs of every node's inventory by health, as of at.
type gpuCounts struct {
	at       time.Time
	byHealth map[string]int
}

// gpuCache keeps the last GPU totals: a scan of every inventory costs
// O(nodes) (about 1.5 s for 10,000 nodes here), so it is redone at most
// once per Config.GPUCacheTTL, and then in the background: a request that
// finds the totals stale gets them as they were (the page shows when they
// were counted) while one recount runs.
type gpuCache struct {
	mu         sync.Mutex
	last       *gpuCounts
	refreshing bool
}

// gpuRecountTimeout bounds one background recount.
const gpuRecountTimeout = time.Minute

func (h *Handler) gpuTotals(ctx context.Context) (*gpuCounts, error) {
	h.gpus.mu.Lock()
	now := h.now()
	l := h.gpus.last
	if l != nil && now.Sub(l.at) < h.cfg.GPUCacheTTL {
		h.gpus.mu.Unlock()
		return l, nil
	}
	if l != nil {
		if !h.gpus.refreshing {
			h.gpus.refreshing = true
			go h.recountGPUs(context.WithoutCancel(ctx))
		}
		h.gpus.mu.Unlock()
		return l, nil
	}
	defer h.gpus.mu.Unlock()
	// The first request counts them itself: there is nothing to show yet.
	byHealth, err := inventory.CountGPUs(ctx, h.store)
	if err != nil {
		return nil, err
	}
	out := &gpuCounts{at: now.UTC(), byHealth: byHealth}
	h.gpus.last = out
	return out, nil
}

// recountGPUs refreshes the cached totals; a failure keeps the old ones
// (the next stale request tries again).
func (h *Handler) recountGPUs(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, gpuRecountTimeout)
	defer cancel()
	at := h.now()
	byHealth, err := inventory.CountGPUs(ctx, h.store)
	h.gpus.mu.Lock()
	defer h.gpus.mu.Unlock()
	h.gpus.refreshing = false
	if err != nil {
		h.log.WarnContext(ctx, "Fleet page: GPU totals not recounted", logkey.Err, err)
		return
	}
	h.gpus.last = &gpuCounts{at: at.UTC(), byHealth: byHealth}
}
