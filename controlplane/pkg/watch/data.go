package watch

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
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
	// GPUs by cell state (fleet.go), gpuStates in the order shown: a GPU
	// of a silent node counts unknown, never ok.
	GPUs      []countRow
	GPUsTotal int
	GPUsAt    time.Time
	// Map is the GPU map, grouped and filtered by MapQ.
	Map *gpuMap
	// Groups names the map's groupings, Pools and Sites its filters' choices.
	Groups    []string
	Pools     []poolInfo
	SiteNames []string
	// Queue is the open remediation cases (oldest first, at most
	// maxQueue of OpenCases), Breakers every pool's breaker.
	Queue     []caseRow
	OpenCases int
	Breakers  []breakerRow
	// Capacity is each pool's GPUs by use; Bars the open reservations on
	// a time line from BarsFrom to BarsTo.
	Capacity         []capacityRow
	Bars             []reservationBar
	BarsFrom, BarsTo time.Time
	BarsHeight       int
	Commands         []countRow
	InFlight         int
	Events           []eventRow
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
	// Act is what the session may do on the page.
	Act *acting
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
	GPUIssues                                int // GPUs neither ok nor reserved (unknown on a silent node)
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

// load reads the page's data within sc (nil: the whole fleet): counts,
// GPU totals (cached), commands in flight, the latest events and one page
// of nodes in state filter after cursor.
func (h *Handler) load(ctx context.Context, sc *scope, filter, cursor string, mq mapQuery) (*view, error) {
	pl, err := h.places(ctx)
	if err != nil {
		return nil, err
	}
	snap, err := h.fleet(ctx)
	if err != nil {
		return nil, err
	}
	snap = sc.restrict(snap)
	var counts []*store.NodeCount
	if sc == nil {
		if counts, err = h.store.NodeCounts(ctx); err != nil {
			return nil, fmt.Errorf("count nodes: %w", err)
		}
	} else {
		counts = nodeCounts(snap)
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

	v.GPUsAt = snap.At
	all := buildMap(snap, mapQuery{Group: "pool"}, 0, 0, func(string) string { return "" })
	v.GPUs, v.GPUsTotal = all.Counts, all.Total
	v.Map = buildMap(snap, mq, h.cfg.CollapseAt, h.cfg.MaxOpenNodes, func(open string) string { return mapHref(mq, filter, open) })
	v.Groups = groupNames
	v.Pools = snap.Pools
	for _, p := range snap.Pools {
		if !slices.Contains(v.SiteNames, p.Site) {
			v.SiteNames = append(v.SiteNames, p.Site)
		}
	}
	slices.Sort(v.SiteNames)
	if v.Queue, v.Breakers, v.OpenCases, err = h.queue(ctx, sc, snap); err != nil {
		return nil, err
	}
	v.Capacity = capacity(snap)
	if v.Bars, v.BarsFrom, v.BarsTo, err = h.reservations(ctx, snap); err != nil {
		return nil, err
	}
	v.BarsHeight = len(v.Bars)*22 + 8
	var open map[string]int
	if sc == nil {
		open, err = h.store.CommandCountOpen(ctx)
	} else {
		open, err = h.openCommands(ctx, snap)
	}
	if err != nil {
		return nil, fmt.Errorf("count commands: %w", err)
	}
	for _, s := range openCommandStates {
		v.Commands = append(v.Commands, countRow{Name: s, Count: open[s]})
		v.InFlight += open[s]
	}
	if v.Events, err = h.latestEvents(ctx, sc, snap); err != nil {
		return nil, err
	}
	if v.Rollouts, err = h.rollouts(ctx, sc, pl); err != nil {
		return nil, err
	}

	// A tenant's session lists its subtree's nodes in the query, so that
	// the page's Next (the ?after= of the next page) is always one of its
	// own nodes, never another tenant's id (docs/tenants.md).
	nodes, err := h.store.NodeList(ctx, &store.NodeListParams{ListParams: store.ListParams{Cursor: cursor,
		Limit: h.cfg.PageSize + 1, Within: sc.path()}, State: filter})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	if len(nodes) > h.cfg.PageSize {
		nodes = nodes[:h.cfg.PageSize]
		v.Next = nodes[len(nodes)-1].ID
	}
	for _, n := range nodes {
		if !sc.pool(n.PoolID) {
			continue // a pool made since the scope was read
		}
		row := nodeRow{ID: n.ID, Hostname: n.Hostname, State: n.State, Cordoned: n.Cordoned, Version: n.BCDVersion,
			Site: pl.site(pl.poolSite[n.PoolID]), Pool: cmp.Or(pl.poolName[n.PoolID], n.PoolID), LastSeen: n.LastSeenAt}
		if fn := snap.byID[n.ID]; fn != nil {
			for _, g := range fn.GPUs {
				row.GPUs++
				if g.State != GPUOK && g.State != GPUReserved {
					row.GPUIssues++
				}
			}
		} else {
			row.GPUs = len(inventory.Decode(n.Inventory).GetGpus())
		}
		v.Nodes = append(v.Nodes, row)
	}
	return v, nil
}

// tenantEventScan is how many of the newest outbox entries a tenant's
// session reads for its Config.Events latest: the others are other
// tenants' or the deployment's.
const tenantEventScan = 1000

// latestEvents returns the newest Config.Events outbox entries, newest
// first; within sc (snap restricted to it) those an event stream of the
// same tenant shows (docs/tenants.md, "Events": the event's pool, else
// its node's pool, lies within the subtree), found among the newest
// tenantEventScan. Their payload is a CloudEvents 1.0 envelope (package
// events); an entry that is not one shows its outbox topic and key (to a
// root session only).
func (h *Handler) latestEvents(ctx context.Context, sc *scope, snap *snapshot) ([]eventRow, error) {
	maxID, err := h.store.OutboxMaxID(ctx)
	if err != nil {
		return nil, fmt.Errorf("latest events: %w", err)
	}
	if maxID == 0 {
		return nil, nil
	}
	// Ids rise by one per entry on both backends, so the newest n lie
	// after maxID-n, give or take a rolled-back insert.
	scan := h.cfg.Events
	if sc != nil {
		scan = max(scan, tenantEventScan)
	}
	entries, err := h.store.OutboxList(ctx, max(0, maxID-int64(scan)), scan)
	if err != nil {
		return nil, fmt.Errorf("latest events: %w", err)
	}
	out := make([]eventRow, 0, h.cfg.Events)
	for i := len(entries) - 1; i >= 0 && len(out) < h.cfg.Events; i-- {
		e := entries[i]
		row := eventRow{ID: e.ID, Time: e.CreatedAt, Type: e.Topic, Subject: e.Key}
		var ce struct {
			Type    string    `json:"type"`
			Subject string    `json:"subject"`
			Time    time.Time `json:"time"`
			Data    struct {
				NodeID string `json:"nodeId"`
				PoolID string `json:"poolId"`
			} `json:"data"`
		}
		ok := json.Unmarshal(e.Payload, &ce) == nil && ce.Type != ""
		if sc != nil && (!ok || !sc.sees(snap, ce.Data.PoolID, ce.Data.NodeID)) {
			continue
		}
		if ok {
			row.Type, row.Subject = ce.Type, cmp.Or(ce.Subject, e.Key)
			if !ce.Time.IsZero() {
				row.Time = ce.Time
			}
		}
		out = append(out, row)
	}
	return out, nil
}
