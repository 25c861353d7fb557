package watch

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// GPU cell states, in the order the page shows them (docs/watch.md, "The
// GPU map"). Every GPU is in exactly one.
const (
	GPUOK          = "ok"          // healthy, its node heartbeats, no case, not reserved now
	GPUDegraded    = "degraded"    // the node says degraded
	GPUFailed      = "failed"      // the node says failed
	GPUUnknown     = "unknown"     // its node is unreachable, powered off or never connected: nothing is known now
	GPUQuarantined = "quarantined" // an open remediation case holds it (detected, held, quarantined, draining, escalated)
	GPURemediating = "remediating" // its case's action runs or is being verified
	GPUReserved    = "reserved"    // healthy and held by a placed or active reservation now
)

// gpuStates are the GPU cell states in the order shown.
var gpuStates = []string{GPUOK, GPUDegraded, GPUFailed, GPUUnknown, GPUQuarantined, GPURemediating, GPUReserved}

// silentNodeStates are the node states in which nothing is known of the
// node's GPUs now: whatever its last inventory said, they read unknown.
var silentNodeStates = []string{store.NodeUnreachable, store.NodePoweredOff, store.NodeJoined}

// cellState is one GPU's state on the page. The order of the rules is the
// order of what matters: a silent node says nothing (unknown, never its
// stale ok), a failed GPU is red whatever is being done about it, then
// the case that holds it, then degraded, then reserved.
func cellState(nodeState, health string, c *store.Remediation, gpuUUID string, reserved bool) string {
	if slices.Contains(silentNodeStates, nodeState) {
		return GPUUnknown
	}
	if health == GPUFailed {
		return GPUFailed
	}
	if c != nil && (c.GPUUUID == "" || c.GPUUUID == gpuUUID) {
		if c.State == store.RemediationRemediating || c.State == store.RemediationVerifying {
			return GPURemediating
		}
		return GPUQuarantined
	}
	switch health {
	case GPUDegraded:
		return GPUDegraded
	case GPUOK:
	default:
		return GPUUnknown
	}
	if reserved {
		return GPUReserved
	}
	return GPUOK
}

// gpuCell is one GPU on the map.
type gpuCell struct {
	UUID, Model, State, Health string
	Index                      int
	MemoryMiB                  uint64
}

// fleetNode is one node of the snapshot with its GPUs' cells.
type fleetNode struct {
	ID, Hostname, State, PoolID, Pool, SiteID, Site, Version string
	Cordoned, InService                                      bool
	Labels                                                   map[string]string
	GPUs                                                     []gpuCell
}

// snapshot is the whole fleet as the map shows it, as of At. Key is what
// it was read for (the newest event id and the node counts): a request
// that finds the same key reuses it.
type snapshot struct {
	At    time.Time
	key   string
	Nodes []*fleetNode          // by node id
	Pools []poolInfo            // by name
	gpu   map[string]*fleetNode // by GPU UUID
	byID  map[string]*fleetNode
}

type poolInfo struct{ ID, Name, SiteID, Site string }

// decoded is a node's decoded GPUs, kept while its inventory digest stays.
type decoded struct {
	digest string
	gpus   []*sessionv1.GPU
}

// fleetCache keeps the last snapshot and the decoded inventories: a
// rebuild re-reads the nodes (one paged scan without inventories) but
// decodes only the inventories whose digest changed. build serialises the
// rebuilds and guards decoded; mu guards last and refreshing.
type fleetCache struct {
	build      sync.Mutex
	decoded    map[string]decoded
	mu         sync.Mutex
	last       *snapshot
	refreshing bool
}

// snapshotRefreshTimeout bounds one background rebuild.
const snapshotRefreshTimeout = time.Minute

// snapshotKey is the cheap read that says whether the fleet changed: the
// newest outbox id and the node counts by site, state and cordon. A GPU's
// health changes only with an event (gpu.health-changed), a node's state
// moves the counts.
func (h *Handler) snapshotKey(ctx context.Context) (string, error) {
	id, err := h.store.OutboxMaxID(ctx)
	if err != nil {
		return "", fmt.Errorf("newest event: %w", err)
	}
	counts, err := h.store.NodeCounts(ctx)
	if err != nil {
		return "", fmt.Errorf("count nodes: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d", id)
	for _, c := range counts {
		fmt.Fprintf(&b, "|%s/%s/%d/%d", c.SiteID, c.State, c.Nodes, c.Cordoned)
	}
	return b.String(), nil
}

// fleet returns the current snapshot. When the key moved (an event, a
// node count) the request rebuilds it (one rebuild at a time; requests
// meanwhile wait for it and reuse it). When the key is the same but the
// snapshot is older than Config.GPUCacheTTL (what changes without an
// event: a reading, a health recovered), the request gets it as it is and
// one rebuild starts in the background.
func (h *Handler) fleet(ctx context.Context) (*snapshot, error) {
	key, err := h.snapshotKey(ctx)
	if err != nil {
		return nil, err
	}
	h.fc.mu.Lock()
	if l := h.fc.last; l != nil && l.key == key {
		if h.now().Sub(l.At) >= h.cfg.GPUCacheTTL && !h.fc.refreshing {
			h.fc.refreshing = true
			go h.refreshSnapshot(context.WithoutCancel(ctx), key)
		}
		h.fc.mu.Unlock()
		return l, nil
	}
	h.fc.mu.Unlock()
	h.fc.build.Lock()
	defer h.fc.build.Unlock()
	h.fc.mu.Lock()
	if l := h.fc.last; l != nil && l.key == key {
		h.fc.mu.Unlock()
		return l, nil
	}
	h.fc.mu.Unlock()
	s, err := h.buildSnapshot(ctx, key)
	if err != nil {
		return nil, err
	}
	h.fc.mu.Lock()
	h.fc.last = s
	h.fc.mu.Unlock()
	return s, nil
}

// refreshSnapshot rebuilds the snapshot off the request path; a failure
// keeps the old one (the next stale request tries again).
func (h *Handler) refreshSnapshot(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(ctx, snapshotRefreshTimeout)
	defer cancel()
	h.fc.build.Lock()
	s, err := h.buildSnapshot(ctx, key)
	h.fc.build.Unlock()
	h.fc.mu.Lock()
	defer h.fc.mu.Unlock()
	h.fc.refreshing = false
	if err != nil {
		h.log.WarnContext(ctx, "Fleet page: snapshot not refreshed", logkey.Err, err)
		return
	}
	if l := h.fc.last; l == nil || l.key == key {
		h.fc.last = s
	}
}

// buildSnapshot (under fc.build) reads every node (store.NodeSummaries, pages of
// store.MaxListLimit, decoding only the inventories whose digest changed), the open
// remediation cases and the reservation slots held now, and works out
// every GPU's cell.
func (h *Handler) buildSnapshot(ctx context.Context, key string) (*snapshot, error) {
	pl, err := h.places(ctx)
	if err != nil {
		return nil, err
	}
	now := h.now()
	cases := map[string]*store.Remediation{}
	for lp := (store.RemediationListParams{OpenOnly: true, ListParams: store.ListParams{Limit: store.MaxListLimit}}); ; {
		list, err := h.store.RemediationList(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("list open cases: %w", err)
		}
		for _, c := range list {
			cases[c.NodeID] = c
		}
		if len(list) < lp.Limit {
			break
		}
		lp.Cursor = list[len(list)-1].ID
	}
	slots, err := h.store.ReservationSlots(ctx, &store.ReservationSlotsParams{From: now, To: now.Add(time.Second)})
	if err != nil {
		return nil, fmt.Errorf("reservation slots: %w", err)
	}
	reserved := map[string]bool{} // node/index
	for _, s := range slots {
		reserved[fmt.Sprintf("%s/%d", s.NodeID, s.GPU)] = true
	}
	s := &snapshot{At: now.UTC(), key: key, gpu: map[string]*fleetNode{}, byID: map[string]*fleetNode{}}
	for id, name := range pl.poolName {
		s.Pools = append(s.Pools, poolInfo{ID: id, Name: name, SiteID: pl.poolSite[id], Site: pl.site(pl.poolSite[id])})
	}
	slices.SortFunc(s.Pools, func(a, b poolInfo) int { return cmp.Compare(a.Name, b.Name) })
	if h.fc.decoded == nil {
		h.fc.decoded = map[string]decoded{}
	}
	seen := map[string]bool{}
	var nodes []*store.Node
	for lp := (store.ListParams{Limit: store.MaxListLimit}); ; {
		page, err := h.store.NodeSummaries(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		nodes = append(nodes, page...)
		if len(page) < lp.Limit {
			break
		}
		lp.Cursor = page[len(page)-1].ID
	}
	// Decode only the inventories whose digest changed since the last
	// snapshot.
	var stale []string
	for _, n := range nodes {
		seen[n.ID] = true
		if d, ok := h.fc.decoded[n.ID]; !ok || d.digest != n.InventoryDigest || n.InventoryDigest == "" {
			stale = append(stale, n.ID)
		}
	}
	for i := 0; i < len(stale); i += store.MaxListLimit {
		invs, err := h.store.NodeInventories(ctx, stale[i:min(i+store.MaxListLimit, len(stale))])
		if err != nil {
			return nil, fmt.Errorf("read inventories: %w", err)
		}
		for _, id := range stale[i:min(i+store.MaxListLimit, len(stale))] {
			h.fc.decoded[id] = decoded{gpus: inventory.Decode(invs[id]).GetGpus()}
		}
	}
	for _, n := range nodes {
		d := h.fc.decoded[n.ID]
		d.digest = n.InventoryDigest
		h.fc.decoded[n.ID] = d
		s.Nodes = append(s.Nodes, h.fleetNode(n, pl, d.gpus, cases[n.ID], reserved))
	}
	for id := range h.fc.decoded {
		if !seen[id] {
			delete(h.fc.decoded, id)
		}
	}
	for _, n := range s.Nodes {
		s.byID[n.ID] = n
		for i := range n.GPUs {
			s.gpu[n.GPUs[i].UUID] = n
		}
	}
	return s, nil
}

// fleetNode makes one node's entry and cells.
func (h *Handler) fleetNode(n *store.Node, pl *places, gpus []*sessionv1.GPU, c *store.Remediation, reserved map[string]bool) *fleetNode {
	siteID := pl.poolSite[n.PoolID]
	fn := &fleetNode{ID: n.ID, Hostname: n.Hostname, State: n.State, PoolID: n.PoolID, Pool: cmp.Or(pl.poolName[n.PoolID], n.PoolID),
		SiteID: siteID, Site: pl.site(siteID), Version: n.BCDVersion, Cordoned: n.Cordoned, Labels: n.Labels,
		InService: n.State == store.NodeReady && !n.Cordoned && n.Disruption == ""}
	for _, g := range gpus {
		health := inventory.HealthName(g.GetHealth())
		fn.GPUs = append(fn.GPUs, gpuCell{UUID: g.GetUuid(), Model: g.GetName(), Health: health, Index: int(g.GetIndex()),
			MemoryMiB: g.GetMemoryTotalBytes() >> 20,
			State:     cellState(n.State, health, c, g.GetUuid(), reserved[fmt.Sprintf("%s/%d", n.ID, g.GetIndex())])})
	}
	return fn
}

// mapQuery is the map's grouping and filters, from the page's query
// string (docs/watch.md, "The GPU map"). Every value is bounded and
// checked; the page never makes one that fails.
type mapQuery struct {
	Group string // pool (default), site, model, state or label:KEY
	Pool  string // a pool's name or id
	Site  string // a site's name or id
	Model string // a substring of the GPU model, any case
	GPU   string // a GPU cell state
	Label string // KEY=VALUE on the node
	Open  string // the group shown whole although large
}

// maxQueryValue bounds each of the map's query values.
const maxQueryValue = 128

var groupNames = []string{"pool", "site", "model", "state"}

func parseMapQuery(get func(string) string) (mapQuery, error) {
	q := mapQuery{Group: cmp.Or(get("group"), "pool"), Pool: get("pool"), Site: get("site"), Model: get("model"),
		GPU: get("gpu"), Label: get("label"), Open: get("open")}
	for name, v := range map[string]string{"group": q.Group, "pool": q.Pool, "site": q.Site, "model": q.Model, "gpu": q.GPU, "label": q.Label, "open": q.Open} {
		if len(v) > maxQueryValue {
			return q, fmt.Errorf("%s is longer than %d bytes", name, maxQueryValue)
		}
	}
	if !slices.Contains(groupNames, q.Group) && !(strings.HasPrefix(q.Group, "label:") && len(q.Group) > len("label:")) {
		return q, fmt.Errorf("group is one of %s or label:KEY", strings.Join(groupNames, ", "))
	}
	if q.GPU != "" && !slices.Contains(gpuStates, q.GPU) {
		return q, fmt.Errorf("gpu is one of %s", strings.Join(gpuStates, ", "))
	}
	if q.Label != "" && !strings.Contains(q.Label, "=") {
		return q, fmt.Errorf("label is KEY=VALUE")
	}
	return q, nil
}

// Filtered reports whether any filter is set.
func (q mapQuery) Filtered() bool {
	return q.Pool != "" || q.Site != "" || q.Model != "" || q.GPU != "" || q.Label != ""
}

func (q mapQuery) nodeMatches(n *fleetNode) bool {
	if q.Pool != "" && q.Pool != n.Pool && q.Pool != n.PoolID {
		return false
	}
	if q.Site != "" && q.Site != n.Site && q.Site != n.SiteID {
		return false
	}
	if q.Label != "" {
		k, v, _ := strings.Cut(q.Label, "=")
		if got, ok := n.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (q mapQuery) gpuMatches(g *gpuCell) bool {
	if q.GPU != "" && g.State != q.GPU {
		return false
	}
	return q.Model == "" || strings.Contains(strings.ToLower(g.Model), strings.ToLower(q.Model))
}

func (q mapQuery) groupOf(n *fleetNode, g *gpuCell) string {
	switch {
	case q.Group == "site":
		return n.Site
	case q.Group == "model":
		if g == nil {
			return "(no GPU)"
		}
		return cmp.Or(g.Model, "(no model)")
	case q.Group == "state":
		if g == nil {
			return "(no GPU)"
		}
		return g.State
	case strings.HasPrefix(q.Group, "label:"):
		return cmp.Or(n.Labels[strings.TrimPrefix(q.Group, "label:")], "(no label)")
	}
	return n.Pool
}

// mapGroup is one group of the map: its counts, and its nodes' cells when
// it is shown open.
type mapGroup struct {
	Name   string
	Sub    string // the pool's site, under group=pool
	Counts []countRow
	GPUs   int
	Nodes  int
	Open   bool
	Rows   []mapRow
	More   int    // nodes not shown of an open group
	Href   string // opens (or closes) the group
}

type mapRow struct {
	ID, Hostname, State string
	Cells               []gpuCell
}

// gpuMap is the map part of the page.
type gpuMap struct {
	Q      mapQuery
	Groups []mapGroup
	// Counts are every matching GPU by state; Total their sum.
	Counts []countRow
	Total  int
	Nodes  int
	At     time.Time
}

// buildMap groups and filters s for q. A group of more than collapseAt
// nodes shows its counts only, unless it is q.Open; an open group shows
// at most maxOpen rows.
func buildMap(s *snapshot, q mapQuery, collapseAt, maxOpen int, href func(open string) string) *gpuMap {
	m := &gpuMap{Q: q, At: s.At}
	type acc struct {
		g      mapGroup
		counts map[string]int
	}
	groups := map[string]*acc{}
	total := map[string]int{}
	get := func(name string) *acc {
		a := groups[name]
		if a == nil {
			a = &acc{g: mapGroup{Name: name}, counts: map[string]int{}}
			groups[name] = a
		}
		return a
	}
	// Rows are kept only as far as a group can show them: a group not
	// named by q.Open shows its rows only with at most collapseAt nodes.
	rowsOf := map[string][]mapRow{}
	keep := func(name string) int {
		if name == q.Open {
			return maxOpen
		}
		return min(collapseAt+1, maxOpen)
	}
	nodesSeen := 0
	// part is a node's GPUs in one group; cells are copied only when
	// the group still keeps rows.
	type part struct {
		name  string
		keep  bool
		cells []gpuCell
	}
	var parts []part
	partOf := func(name string) int {
		for j := range parts {
			if parts[j].name == name {
				return j
			}
		}
		parts = append(parts, part{name: name, keep: len(rowsOf[name]) < keep(name)})
		return len(parts) - 1
	}
	for _, n := range s.Nodes {
		if !q.nodeMatches(n) {
			continue
		}
		parts = parts[:0]
		for i := range n.GPUs {
			g := &n.GPUs[i]
			if !q.gpuMatches(g) {
				continue
			}
			j := partOf(q.groupOf(n, g))
			total[g.State]++
			get(parts[j].name).counts[g.State]++
			if parts[j].keep {
				parts[j].cells = append(parts[j].cells, *g)
			}
		}
		if len(n.GPUs) == 0 && q.Model == "" && q.GPU == "" {
			partOf(q.groupOf(n, nil))
		}
		if len(parts) > 0 {
			nodesSeen++
		}
		for _, p := range parts {
			a := get(p.name)
			if q.Group == "pool" {
				a.g.Sub = n.Site
			}
			a.g.Nodes++
			if p.keep {
				rowsOf[p.name] = append(rowsOf[p.name], mapRow{ID: n.ID, Hostname: n.Hostname, State: n.State, Cells: p.cells})
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(groups)) {
		a := groups[name]
		for _, st := range gpuStates {
			a.g.Counts = append(a.g.Counts, countRow{Name: st, Count: a.counts[st]})
			a.g.GPUs += a.counts[st]
		}
		a.g.Open = a.g.Nodes <= collapseAt || q.Open == name
		if a.g.Nodes > collapseAt {
			if q.Open == name {
				a.g.Href = href("")
			} else {
				a.g.Href = href(name)
			}
		}
		if a.g.Open {
			a.g.Rows = rowsOf[name]
			a.g.More = a.g.Nodes - len(a.g.Rows)
		}
		m.Groups = append(m.Groups, a.g)
	}
	for _, st := range gpuStates {
		m.Counts = append(m.Counts, countRow{Name: st, Count: total[st]})
		m.Total += total[st]
	}
	m.Nodes = nodesSeen
	return m
}

// mapHref is the page's URL with q's grouping and filters, the node
// list's state filter, and open as the opened group ("" none).
func mapHref(q mapQuery, state, open string) string {
	v := url.Values{}
	for k, val := range map[string]string{"pool": q.Pool, "site": q.Site, "model": q.Model, "gpu": q.GPU, "label": q.Label, "open": open, "state": state} {
		if val != "" {
			v.Set(k, val)
		}
	}
	if q.Group != "pool" {
		v.Set("group", q.Group)
	}
	if len(v) == 0 {
		return Path
	}
	return Path + "?" + v.Encode()
}
