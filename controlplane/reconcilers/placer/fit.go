package placer

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// interval is a held slot of one GPU.
type interval struct {
	start, end  time.Time
	reservation string
}

type gpuKey struct {
	node string
	gpu  int
}

// Bookings are the held slots of some nodes, per node and GPU index in
// time order (no two of one GPU overlap: the store's rule).
type Bookings struct {
	byNode map[string][][]interval // node -> GPU index -> slots
	byRes  map[string][]gpuKey
}

// NewBookings indexes slots (held ones; empty ranges are skipped).
func NewBookings(slots []*store.ReservationSlot) *Bookings {
	b := &Bookings{byNode: map[string][][]interval{}, byRes: map[string][]gpuKey{}}
	for _, s := range slots {
		b.add(s)
	}
	return b
}

// add books one slot.
func (b *Bookings) add(s *store.ReservationSlot) {
	if !s.Start.Before(s.End) || s.GPU < 0 {
		return
	}
	gpus := b.byNode[s.NodeID]
	for len(gpus) <= s.GPU {
		gpus = append(gpus, nil)
	}
	l := gpus[s.GPU]
	i := sort.Search(len(l), func(i int) bool { return !l[i].start.Before(s.Start) })
	gpus[s.GPU] = slices.Insert(l, i, interval{s.Start, s.End, s.ReservationID})
	b.byNode[s.NodeID] = gpus
	b.byRes[s.ReservationID] = append(b.byRes[s.ReservationID], gpuKey{s.NodeID, s.GPU})
}

// remove drops every slot of reservation id.
func (b *Bookings) remove(id string) {
	for _, k := range b.byRes[id] {
		gpus := b.byNode[k.node]
		gpus[k.gpu] = slices.DeleteFunc(gpus[k.gpu], func(iv interval) bool { return iv.reservation == id })
	}
	delete(b.byRes, id)
}

// freeIn reports whether GPU gpu of a node whose slots are gpus has no
// slot overlapping [s, e).
func freeIn(gpus [][]interval, gpu int, s, e time.Time) bool {
	if gpu >= len(gpus) || gpu < 0 {
		return true
	}
	l := gpus[gpu]
	// The first slot ending after s; slots of one GPU never overlap, so
	// they are in end order too.
	i := sort.Search(len(l), func(i int) bool { return l[i].end.After(s) })
	return i == len(l) || !l[i].start.Before(e)
}

// Request is what a reservation asks of Fit.
type Request struct {
	// GPUs or Nodes: exactly one is above zero.
	GPUs, Nodes int
	// Model is a case-insensitive substring of the GPU product name; ""
	// any. MinGPUMemoryMiB is each GPU's least memory.
	Model           string
	MinGPUMemoryMiB int64
	// Selector must be held by the node's labels.
	Selector   map[string]string
	Start, End time.Time
	// Exclude names nodes not to use (the ones a swap moves off).
	Exclude map[string]bool
}

// RequestOf is the request of a reservation.
func RequestOf(r *store.Reservation) *Request {
	return &Request{GPUs: r.GPUs, Nodes: r.Nodes, Model: r.GPUModel, MinGPUMemoryMiB: r.MinGPUMemoryMiB,
		Selector: r.Selector, Start: r.Start, End: r.End}
}

// candidate is a node that may take part of a request.
type candidate struct {
	node  *Node
	free  []int // matching GPUs free for the window, by index
	whole bool  // every GPU of the node matches, is healthy and is free
}

// Fit chooses the slots for req on nodes given the bookings (the rule in
// the package doc), or returns why none fit. Nodes are taken in id order
// where the rule leaves a tie. The slots carry node, GPU index and UUID;
// their times are the store's to set.
func Fit(nodes []*Node, b *Bookings, req *Request) ([]*store.ReservationSlot, string) {
	var cands []candidate
	matching, out := 0, 0
	model := strings.ToLower(req.Model)
	for _, n := range nodes {
		if req.Exclude[n.ID] || !labelsHold(n.Labels, req.Selector) {
			continue
		}
		c := candidate{node: n, whole: len(n.GPUs) > 0}
		any := false
		booked := b.byNode[n.ID]
		for _, g := range n.GPUs {
			ok := g.matches(model, req.MinGPUMemoryMiB)
			any = any || ok
			if ok && g.Healthy && freeIn(booked, g.Index, req.Start, req.End) {
				c.free = append(c.free, g.Index)
			} else {
				c.whole = false
			}
		}
		if !any {
			continue
		}
		matching++
		if n.Unavailable != "" {
			out++
			continue
		}
		if req.GPUs > 0 && len(c.free) == req.GPUs {
			// Exactly N free: no node fits better, and nodes come in id
			// order, so none ties before it.
			return slotsOf([]candidate{c}, req.GPUs), ""
		}
		cands = append(cands, c)
	}
	if req.Nodes > 0 {
		var whole []candidate
		for _, c := range cands {
			if c.whole {
				whole = append(whole, c)
			}
		}
		if len(whole) < req.Nodes {
			return nil, fmt.Sprintf("%d whole nodes%s free for the window: %d matching nodes (%d of them out of service), %d wholly free",
				req.Nodes, what(req), matching, out, len(whole))
		}
		slices.SortStableFunc(whole, func(a, b candidate) int { return cmp.Compare(len(a.node.GPUs), len(b.node.GPUs)) })
		return slotsOf(whole[:req.Nodes], 0), ""
	}
	// Best fit on one node: the fewest free matching GPUs that still fit.
	best, most := -1, 0
	for i, c := range cands {
		most = max(most, len(c.free))
		if len(c.free) >= req.GPUs && (best < 0 || len(c.free) < len(cands[best].free)) {
			best = i
			if len(c.free) == req.GPUs {
				break
			}
		}
	}
	if best >= 0 {
		return slotsOf(cands[best:best+1], req.GPUs), ""
	}
	// Whole nodes of one GPU count that divides N: the most GPUs each first.
	byCount := map[int][]candidate{}
	for _, c := range cands {
		if c.whole {
			byCount[len(c.node.GPUs)] = append(byCount[len(c.node.GPUs)], c)
		}
	}
	counts := slices.Sorted(func(yield func(int) bool) {
		for k := range byCount {
			if !yield(k) {
				return
			}
		}
	})
	slices.Reverse(counts)
	for _, g := range counts {
		if req.GPUs%g == 0 && len(byCount[g]) >= req.GPUs/g {
			return slotsOf(byCount[g][:req.GPUs/g], 0), ""
		}
	}
	return nil, fmt.Sprintf("%d GPUs%s free for the window on one node, or as whole nodes: %d matching nodes (%d of them out of service), at most %d free on one",
		req.GPUs, what(req), matching, out, most)
}

// slotsOf is the slots of cands: the first n free GPUs of each (n 0: all
// of them, whole nodes).
func slotsOf(cands []candidate, n int) []*store.ReservationSlot {
	var out []*store.ReservationSlot
	for _, c := range cands {
		take := c.free
		if n > 0 {
			take = take[:n]
		}
		for _, idx := range take {
			uuid := ""
			for _, g := range c.node.GPUs {
				if g.Index == idx {
					uuid = g.UUID
				}
			}
			out = append(out, &store.ReservationSlot{NodeID: c.node.ID, GPU: idx, GPUUUID: uuid})
		}
	}
	return out
}

// what describes a request's GPU filter for a reason.
func what(req *Request) string {
	var parts []string
	if req.Model != "" {
		parts = append(parts, "of model "+req.Model)
	}
	if req.MinGPUMemoryMiB > 0 {
		parts = append(parts, fmt.Sprintf("with at least %d MiB", req.MinGPUMemoryMiB))
	}
	if len(req.Selector) > 0 {
		parts = append(parts, "on nodes matching the labels")
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

// labelsHold reports whether labels hold every selector entry.
func labelsHold(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
