package watch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/store"
	eventsv1 "github.com/better-compute/better-compute/proto/events/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Bounds of what the node and GPU pages read (docs/watch.md, "Node and
// GPU pages").
const (
	// timelineEvents is how many of a subject's newest events are read.
	timelineEvents = 200
	// timelineShown is how many timeline entries a page shows.
	timelineShown = 200
	// commandScan bounds the commands of a node read to find its newest
	// (command ids are random, so the list is read whole up to this).
	commandScan = 5000
	// commandsShown is how many of a node's newest commands are shown.
	commandsShown = 20
	// casesShown is how many of a node's or GPU's newest cases are shown.
	casesShown = 20
	// gpuNodes bounds the nodes a GPU page follows a GPU through.
	gpuNodes = 10
)

// nodeIDRE and gpuUUIDRE are what a node id and a GPU UUID in a page's
// path may look like; anything else is a 400, never a store read.
var (
	nodeIDRE  = regexp.MustCompile(`^[a-z]+_[a-z0-9]{1,64}$`)
	gpuUUIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
)

// gpuRow is one GPU of a node page or the GPU page: the inventory's
// readings and its cell.
type gpuRow struct {
	gpuCell
	Serial, PCI, Driver, CUDA string
	TempC                     uint32
	PowerW, PowerLimitW       uint32
	ECCVolatileUncorrected    uint64
	ECCAggregateUncorrected   uint64
	RetiredPages              uint32
	RemappedRowsUncorrectable uint32
	RemapPending, RemapFailed bool
	Reasons                   []string
}

// entry is one line of a timeline: what happened, when, and its evidence
// as text.
type entry struct {
	Time     time.Time
	seq      int64  // the outbox id of an event's entry (0 for others): the order of equal times
	Kind     string // finding, remediation, command, rollout, node, reservation
	What     string
	Detail   string
	LogLine  string   // a finding's kernel-log line (the XID line)
	Counters []string // a finding's counters, "name=value"
	Case     string   // a remediation step's case id
	Node     string   // the node it happened on (GPU page)
	GPU      string   // the GPU it names
}

// caseView is a remediation case with its steps, oldest first.
type caseView struct {
	*store.Remediation
	Steps []entry
}

type reservationRow struct {
	ID, Owner, State, Note string
	GPUs                   []int
	Start, End             time.Time
}

type nodeView struct {
	Generated time.Time
	CSRF      string
	Act       *acting
	Node      *store.Node
	Pool      string
	Site      string
	Labels    []string
	Host      *sessionv1.HostInfo
	Plugins   []*sessionv1.PluginInfo
	GPUStatus string
	GPUs      []gpuRow
	Counts    []countRow
	Session   *store.Session
	BMC       string
	Reserved  []reservationRow
	Cases     []caseView
	Commands  []*store.Command
	Timeline  []entry
}

type gpuView struct {
	Generated time.Time
	CSRF      string
	UUID      string
	GPU       *gpuRow
	Node      *fleetNode // the node that reports it now; nil when none does
	Nodes     []string   // every node it was seen in, newest first
	Hosts     map[string]string
	Cases     []caseView
	Timeline  []entry
}

// errNoSuch is a page for a node or GPU the fleet does not know.
var errNoSuch = errors.New("not found")

func gpuRowOf(g *sessionv1.GPU, state string) gpuRow {
	return gpuRow{gpuCell: gpuCell{UUID: g.GetUuid(), Model: g.GetName(), Index: int(g.GetIndex()), MemoryMiB: g.GetMemoryTotalBytes() >> 20,
		Health: inventory.HealthName(g.GetHealth()), State: state},
		Serial: g.GetSerial(), PCI: g.GetPciBusId(), Driver: g.GetDriverVersion(), CUDA: g.GetCudaDriverVersion(),
		TempC: g.GetTemperatureC(), PowerW: g.GetPowerDrawMw() / 1000, PowerLimitW: g.GetPowerLimitMw() / 1000,
		ECCVolatileUncorrected: g.GetEccVolatileUncorrected(), ECCAggregateUncorrected: g.GetEccAggregateUncorrected(),
		RetiredPages: g.GetRetiredPages(), RemappedRowsUncorrectable: g.GetRemappedRowsUncorrectable(),
		RemapPending: g.GetRemappedRowsPending(), RemapFailed: g.GetRemappedRowsFailed(), Reasons: g.GetHealth().GetReasons()}
}

// loadNode reads a node's page; a node outside sc is errNoSuch.
func (h *Handler) loadNode(ctx context.Context, sc *scope, id string) (*nodeView, error) {
	n, err := h.store.NodeGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && !sc.pool(n.PoolID) {
		return nil, errNoSuch
	}
	if err != nil {
		return nil, fmt.Errorf("read node: %w", err)
	}
	pl, err := h.places(ctx)
	if err != nil {
		return nil, err
	}
	now := h.now()
	v := &nodeView{Generated: now.UTC(), Node: n, Pool: cmp.Or(pl.poolName[n.PoolID], n.PoolID), Site: pl.site(pl.poolSite[n.PoolID])}
	for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
		v.Labels = append(v.Labels, k+"="+n.Labels[k])
	}
	inv := inventory.Decode(n.Inventory)
	v.Host, v.Plugins, v.GPUStatus = inv.GetHost(), inv.GetPlugins(), inv.GetGpuStatus()

	open, err := h.store.RemediationOpenFor(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		open = nil
	} else if err != nil {
		return nil, fmt.Errorf("read the node's case: %w", err)
	}
	slots, err := h.store.ReservationSlots(ctx, &store.ReservationSlotsParams{PoolID: n.PoolID, From: now, To: now.Add(time.Second)})
	if err != nil {
		return nil, fmt.Errorf("reservation slots: %w", err)
	}
	reservedNow := map[int]bool{}
	for _, s := range slots {
		if s.NodeID == id {
			reservedNow[s.GPU] = true
		}
	}
	counts := map[string]int{}
	for _, g := range inv.GetGpus() {
		st := cellState(n.State, inventory.HealthName(g.GetHealth()), open, g.GetUuid(), reservedNow[int(g.GetIndex())])
		v.GPUs = append(v.GPUs, gpuRowOf(g, st))
		counts[st]++
	}
	for _, st := range gpuStates {
		v.Counts = append(v.Counts, countRow{Name: st, Count: counts[st]})
	}

	if v.Session, err = h.store.SessionGet(ctx, id); errors.Is(err, store.ErrNotFound) {
		v.Session = nil
	} else if err != nil {
		return nil, fmt.Errorf("read the node's session: %w", err)
	}

	rs, err := h.store.ReservationsOpen(ctx, []string{n.PoolID})
	if err != nil {
		return nil, fmt.Errorf("open reservations: %w", err)
	}
	for _, r := range rs {
		row := reservationRow{ID: r.ID, Owner: r.Owner, State: r.State, Note: r.Note, Start: r.Start, End: r.End}
		for _, s := range r.Slots {
			if s.NodeID == id {
				row.GPUs = append(row.GPUs, s.GPU)
			}
		}
		if len(row.GPUs) > 0 {
			v.Reserved = append(v.Reserved, row)
		}
	}

	// The timeline: the node's own events (node.*, remediation.*), each
	// GPU's findings, its commands and its rollouts.
	nodeEvents, err := h.store.OutboxQuery(ctx, &store.OutboxQueryParams{Key: id, Limit: timelineEvents})
	if err != nil {
		return nil, fmt.Errorf("the node's events: %w", err)
	}
	for _, e := range nodeEvents {
		if en, ok := entryOf(e); ok {
			v.Timeline = append(v.Timeline, en)
		}
	}
	v.BMC = bmcState(n.State, nodeEvents)
	for _, g := range inv.GetGpus() {
		if !gpuUUIDRE.MatchString(g.GetUuid()) {
			continue
		}
		es, err := h.store.OutboxQuery(ctx, &store.OutboxQueryParams{Key: g.GetUuid(), Limit: timelineEvents / 4})
		if err != nil {
			return nil, fmt.Errorf("GPU %s's events: %w", g.GetUuid(), err)
		}
		for _, e := range es {
			if en, ok := entryOf(e); ok && (en.Node == "" || en.Node == id) {
				v.Timeline = append(v.Timeline, en)
			}
		}
	}
	cases, err := h.store.RemediationRecent(ctx, id, time.Time{}, casesShown)
	if err != nil {
		return nil, fmt.Errorf("the node's cases: %w", err)
	}
	for _, c := range cases {
		v.Cases = append(v.Cases, caseView{Remediation: c, Steps: stepsOf(c.ID, nodeEvents)})
	}
	if v.Commands, err = h.newestCommands(ctx, id); err != nil {
		return nil, err
	}
	for _, c := range v.Commands {
		what := c.Kind + " " + c.State
		if c.ExitCode != nil {
			what += fmt.Sprintf(" (exit %d)", *c.ExitCode)
		}
		v.Timeline = append(v.Timeline, entry{Time: cmp.Or(ptime(c.FinishedAt), c.CreatedAt), Kind: "command", What: what,
			Detail: strings.TrimSpace(c.ID + " by " + c.CreatedBy + " " + c.Error)})
	}
	ros, err := h.store.RolloutList(ctx, &store.RolloutListParams{PoolID: n.PoolID, ListParams: store.ListParams{Limit: maxRollouts}})
	if err != nil {
		return nil, fmt.Errorf("list rollouts: %w", err)
	}
	for _, ro := range ros {
		rns, err := h.store.RolloutNodes(ctx, ro.ID)
		if err != nil {
			return nil, fmt.Errorf("read rollout %s: %w", ro.ID, err)
		}
		for _, rn := range rns {
			if rn.NodeID == id && rn.State != store.RolloutNodePending {
				v.Timeline = append(v.Timeline, entry{Time: rn.StateSince, Kind: "rollout",
					What:   fmt.Sprintf("rollout to %s: %s (wave %d)", ro.Version, rn.State, rn.Wave),
					Detail: strings.TrimSpace(ro.ID + " " + rn.Reason)})
			}
		}
	}
	sortTimeline(&v.Timeline)
	return v, nil
}

func ptime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func sortTimeline(t *[]entry) {
	slices.SortStableFunc(*t, func(a, b entry) int { return cmp.Or(b.Time.Compare(a.Time), cmp.Compare(b.seq, a.seq)) })
	if len(*t) > timelineShown {
		*t = (*t)[:timelineShown]
	}
}

// newestCommands returns the node's newest commands (by creation),
// reading at most commandScan of them.
func (h *Handler) newestCommands(ctx context.Context, id string) ([]*store.Command, error) {
	var all []*store.Command
	for lp := (store.CommandListParams{NodeID: id, ListParams: store.ListParams{Limit: store.MaxListLimit}}); len(all) < commandScan; {
		cs, err := h.store.CommandList(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("the node's commands: %w", err)
		}
		all = append(all, cs...)
		if len(cs) < lp.Limit {
			break
		}
		lp.Cursor = cs[len(cs)-1].ID
	}
	slices.SortFunc(all, func(a, b *store.Command) int { return b.CreatedAt.Compare(a.CreatedAt) })
	if len(all) > commandsShown {
		all = all[:commandsShown]
	}
	return all, nil
}

// bmcState says what the node's BMC last told: its power state from the
// liveness events (node.unresponsive: silent while its BMC says on;
// node.powered-off: the BMC says off).
func bmcState(state string, evs []*store.OutboxEntry) string {
	if state == store.NodePoweredOff {
		return "off (the BMC says the machine is powered off)"
	}
	for _, e := range evs { // newest first
		switch e.Topic {
		case events.NodeUnresponsive:
			return "on, the node silent (" + e.CreatedAt.UTC().Format(time.DateTime) + "Z)"
		case events.NodePoweredOff:
			return "off (" + e.CreatedAt.UTC().Format(time.DateTime) + "Z)"
		case events.NodeReady:
			return "not asked since the node last connected"
		}
	}
	return "not asked"
}

// stepsOf returns case id's steps (its remediation.* events), oldest
// first.
func stepsOf(id string, evs []*store.OutboxEntry) []entry {
	var out []entry
	for _, e := range evs {
		if en, ok := entryOf(e); ok && en.Case == id {
			out = append(out, en)
		}
	}
	slices.SortStableFunc(out, func(a, b entry) int { return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.seq, b.seq)) })
	return out
}

// entryOf turns an outbox entry (a CloudEvents envelope) into a timeline
// entry; ok is false for one the page does not show.
func entryOf(e *store.OutboxEntry) (entry, bool) {
	var ce struct {
		Type string          `json:"type"`
		Time time.Time       `json:"time"`
		Data json.RawMessage `json:"data"`
	}
	if json.Unmarshal(e.Payload, &ce) != nil || ce.Type == "" {
		return entry{}, false
	}
	en := entry{Time: cmp.Or(ce.Time, e.CreatedAt), seq: e.ID, What: strings.TrimPrefix(ce.Type, eventsv1.TypePrefix)}
	switch {
	case ce.Type == events.GPUHealthChanged:
		var d events.GPUHealthData
		if json.Unmarshal(ce.Data, &d) != nil {
			return entry{}, false
		}
		en.Kind, en.Node, en.GPU = "finding", d.NodeID, d.GPUUUID
		f, err := d.GPUFinding()
		if err == nil && f != nil {
			if x := f.GetXid(); x != nil {
				en.What = fmt.Sprintf("XID %d %s", x.GetCode(), x.GetMnemonic())
			} else {
				en.What = d.Kind
			}
			en.Detail = strings.TrimSpace(fmt.Sprintf("%s · resolution %s · health %s · %s", d.Severity, cmp.Or(f.GetResolution(), "none"),
				strings.ToLower(strings.TrimPrefix(f.GetHealth().String(), "GPU_HEALTH_STATE_")), f.GetEvidence().GetMessage()))
			en.LogLine = f.GetEvidence().GetLogLine()
			for _, k := range slices.Sorted(maps.Keys(f.GetEvidence().GetCounters())) {
				en.Counters = append(en.Counters, fmt.Sprintf("%s=%d", k, f.GetEvidence().GetCounters()[k]))
			}
		} else {
			en.What, en.Detail = d.Kind, d.Message
		}
	case strings.HasPrefix(ce.Type, eventsv1.TypePrefix+"remediation.breaker"):
		return entry{}, false
	case strings.HasPrefix(ce.Type, eventsv1.TypePrefix+"remediation."):
		var d events.RemediationData
		if json.Unmarshal(ce.Data, &d) != nil {
			return entry{}, false
		}
		en.Kind, en.Case, en.Node, en.GPU = "remediation", d.RemediationID, d.NodeID, d.GPUUUID
		en.What = "case " + d.State
		parts := []string{"action " + cmp.Or(d.Action, "none"), fmt.Sprintf("attempt %d", d.Attempts)}
		if d.CommandID != "" {
			parts = append(parts, "command "+d.CommandID)
		}
		if d.Reason != "" {
			parts = append(parts, d.Reason)
		}
		en.Detail = strings.Join(parts, " · ")
	case strings.HasPrefix(ce.Type, eventsv1.TypePrefix+"node."):
		en.Kind = "node"
	case strings.HasPrefix(ce.Type, eventsv1.TypePrefix+"reservation."):
		en.Kind = "reservation"
	default:
		return entry{}, false
	}
	return en, true
}

// loadGPU reads a GPU's page: the node that reports it now, its findings
// on every node it was seen in (gpu.health-changed has the GPU's UUID as
// its subject), and the cases that named it with their steps. Within a
// tenant's scope sc it shows the GPU's part on the scope's nodes only (a
// GPU seen on none of them is errNoSuch).
func (h *Handler) loadGPU(ctx context.Context, sc *scope, uuid string) (*gpuView, error) {
	s, err := h.fleet(ctx)
	if err != nil {
		return nil, err
	}
	s = sc.restrict(s)
	v := &gpuView{Generated: h.now().UTC(), UUID: uuid, Hosts: map[string]string{}}
	for _, n := range s.Nodes {
		v.Hosts[n.ID] = n.Hostname
	}
	es, err := h.store.OutboxQuery(ctx, &store.OutboxQueryParams{Key: uuid, Limit: timelineEvents})
	if err != nil {
		return nil, fmt.Errorf("the GPU's events: %w", err)
	}
	if n := s.gpu[uuid]; n != nil {
		v.Node = n
		v.Nodes = append(v.Nodes, n.ID)
		if full, err := h.store.NodeGet(ctx, n.ID); err == nil {
			for _, g := range inventory.Decode(full.Inventory).GetGpus() {
				if g.GetUuid() == uuid {
					st := GPUUnknown
					for _, c := range n.GPUs {
						if c.UUID == uuid {
							st = c.State
						}
					}
					row := gpuRowOf(g, st)
					v.GPU = &row
				}
			}
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("read node: %w", err)
		}
	}
	for _, e := range es {
		if en, ok := entryOf(e); ok {
			if sc != nil && s.byID[en.Node] == nil {
				continue // on a node outside the scope, or on none
			}
			v.Timeline = append(v.Timeline, en)
			if en.Node != "" && !slices.Contains(v.Nodes, en.Node) && len(v.Nodes) < gpuNodes {
				v.Nodes = append(v.Nodes, en.Node)
			}
		}
	}
	if v.Node == nil && len(v.Timeline) == 0 {
		return nil, errNoSuch
	}
	for _, nodeID := range v.Nodes {
		cases, err := h.store.RemediationRecent(ctx, nodeID, time.Time{}, casesShown)
		if err != nil {
			return nil, fmt.Errorf("the cases of %s: %w", nodeID, err)
		}
		var nodeEvents []*store.OutboxEntry
		for _, c := range cases {
			if c.GPUUUID != uuid {
				continue
			}
			if nodeEvents == nil {
				if nodeEvents, err = h.store.OutboxQuery(ctx, &store.OutboxQueryParams{Key: nodeID, TopicPrefix: eventsv1.TypePrefix + "remediation.", Limit: timelineEvents}); err != nil {
					return nil, fmt.Errorf("the steps of %s's cases: %w", nodeID, err)
				}
			}
			cv := caseView{Remediation: c, Steps: stepsOf(c.ID, nodeEvents)}
			v.Cases = append(v.Cases, cv)
			v.Timeline = append(v.Timeline, cv.Steps...)
		}
	}
	sortTimeline(&v.Timeline)
	return v, nil
}
