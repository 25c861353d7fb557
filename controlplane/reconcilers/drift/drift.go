// Package drift finds the nodes whose NVIDIA driver or CUDA version differs
// from the rest of their pool (docs/gpu-health.md, "Drift"; issue 43): a job
// of the controllers role, under the singleton lease LeaseName, that reads
// every node's summary once a round (gpuHealth.driftInterval) and decodes
// the inventories whose digest changed since the last round (Job).
//
// The pool's version of each (driver, CUDA) is the one the most of its
// nodes with GPUs report (a plurality); when two or more versions tie for
// the most, the pool has none (it is mid-upgrade, or evenly split) and no
// node drifts on it. A node without GPUs, or whose inventory names no
// version, is left out of the count and never drifts. A pool of one node
// never drifts.
//
// A node that drifts is a node finding (sessionv1.GPUFinding, signal
// drift, no GPU; resolution UPDATE_SWFW, NVIDIA's word for a software
// update; the default policy's action none): the job writes it as the
// node's gpu.drift event, once when the drift starts or changes, and keeps
// it in the node's label Label, which `nodes get` shows, until it ends.
// When the node reports its pool's versions again (or the pool's version
// moves to the node's) the label is removed and a KindEnded event written.
package drift

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Log attribute keys of this package.
const (
	attrPool  = "pool"
	attrDrift = "drift"
)

// LeaseName is the job's singleton lease.
const LeaseName = "singleton:drift"

// Label is the node label that holds a drifting node's finding in one line,
// for example "driver 535.104.05 (pool 550.54.15)"; absent while the node
// matches its pool.
const Label = "better-compute.io/drift"

// KindEnded is the kind of the node event written when a node's drift ends.
const KindEnded = "node.drift-ended"

// Resolution is what a drifting node calls for: NVIDIA's word for a
// software or firmware update.
const Resolution = "UPDATE_SWFW"

// Node is what the job reads of one node: its pool, its versions (from the
// last inventory's GPUs; empty when it lists none) and its Label.
type Node struct {
	ID, PoolID   string
	Driver, CUDA string
	Label        string
}

// Versions returns the driver and CUDA versions of an inventory: those of
// its first GPU that names them (one driver serves every GPU of a node);
// empty when it lists no GPU.
func Versions(inv *sessionv1.Inventory) (driver, cuda string) {
	for _, g := range inv.GetGpus() {
		driver = cmp.Or(driver, g.GetDriverVersion())
		cuda = cmp.Or(cuda, g.GetCudaDriverVersion())
	}
	return driver, cuda
}

// PoolVersion returns the version the most of vs name (empty ones left
// out) and how many name it; ok is false when vs names none or two
// versions tie for the most.
func PoolVersion(vs []string) (version string, n int, ok bool) {
	counts := map[string]int{}
	for _, v := range vs {
		if v != "" {
			counts[v]++
		}
	}
	tie := false
	for _, v := range slices.Sorted(maps.Keys(counts)) {
		switch c := counts[v]; {
		case c > n:
			version, n, tie = v, c, false
		case c == n:
			tie = true
		}
	}
	if n == 0 || tie {
		return "", 0, false
	}
	return version, n, true
}

// Judge returns the drift finding of each node of nodes (one pool's) that
// drifts, by node id, observed at now; nodes that match, or that the pool
// has no version for, are not in it.
func Judge(nodes []Node, now time.Time) map[string]*sessionv1.GPUFinding {
	var drivers, cudas []string
	compared := 0
	for _, n := range nodes {
		if n.Driver == "" && n.CUDA == "" {
			continue
		}
		compared++
		drivers = append(drivers, n.Driver)
		cudas = append(cudas, n.CUDA)
	}
	if compared < 2 {
		return nil
	}
	poolDriver, _, driverOK := PoolVersion(drivers)
	poolCUDA, _, cudaOK := PoolVersion(cudas)
	signals := map[string]*sessionv1.DriftSignal{}
	for _, n := range nodes {
		s := &sessionv1.DriftSignal{PoolNodes: uint32(compared)}
		if driverOK && n.Driver != "" && n.Driver != poolDriver {
			s.DriverVersion, s.PoolDriverVersion = n.Driver, poolDriver
		}
		if cudaOK && n.CUDA != "" && n.CUDA != poolCUDA {
			s.CudaVersion, s.PoolCudaVersion = n.CUDA, poolCUDA
		}
		if s.DriverVersion != "" || s.CudaVersion != "" {
			signals[n.ID] = s
		}
	}
	matching := compared - len(signals)
	out := make(map[string]*sessionv1.GPUFinding, len(signals))
	for id, s := range signals {
		s.MatchingNodes = uint32(matching)
		line := Summary(s)
		out[id] = &sessionv1.GPUFinding{
			Signal:              &sessionv1.GPUFinding_Drift{Drift: s},
			ImmediateResolution: Resolution, Resolution: Resolution,
			Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED,
			Evidence: &sessionv1.GPUFindingEvidence{Source: "inventory",
				Message: fmt.Sprintf("%s: %d of the pool's %d GPU nodes report the pool's versions", line, matching, compared)},
			ObservedAt: timestamppb.New(now),
		}
	}
	return out
}

// Summary is a drift signal in one line, the value of Label: "driver
// 535.104.05 (pool 550.54.15)", "cuda 12.2 (pool 12.4)", or both joined
// by ", ".
func Summary(s *sessionv1.DriftSignal) string {
	var parts []string
	if s.GetDriverVersion() != "" {
		parts = append(parts, fmt.Sprintf("driver %s (pool %s)", s.GetDriverVersion(), s.GetPoolDriverVersion()))
	}
	if s.GetCudaVersion() != "" {
		parts = append(parts, fmt.Sprintf("cuda %s (pool %s)", s.GetCudaVersion(), s.GetPoolCudaVersion()))
	}
	return strings.Join(parts, ", ")
}

// Store is what a round reads and writes.
type Store interface {
	NodeSummaries(ctx context.Context, p *store.ListParams) ([]*store.Node, error)
	NodeInventories(ctx context.Context, ids []string) (map[string][]byte, error)
	store.FencedTransactor
}

// driftTx is what a round's transaction touches: the drift label and its
// events.
type driftTx interface {
	NodeSetLabel(ctx context.Context, id, key, value string) error
	EventInsert(ctx context.Context, e *store.Event) (int64, error)
}

// Metrics receives each round's count of drifting nodes per pool (every
// pool with GPU nodes, 0 included); nil: not reported.
type Metrics interface {
	NodesDrifting(counts map[string]int)
}

// versions are a node's versions as of its inventory's digest.
type versions struct{ digest, driver, cuda string }

// Job is the drift job. It remembers each node's versions by its
// inventory's digest, so a round decodes only the inventories that changed
// since the last (the fleet page's way). Not safe for concurrent rounds.
type Job struct {
	st    Store
	m     Metrics
	log   *slog.Logger
	known map[string]versions // by node id
}

// NewJob returns the job over st; m may be nil (no metrics).
func NewJob(st Store, m Metrics, log *slog.Logger) *Job {
	return &Job{st: st, m: m, log: log, known: map[string]versions{}}
}

// nodes reads every node's summary (in pages of store.MaxListLimit:
// O(nodes)) and the inventories whose digest changed, and returns the
// nodes by pool.
func (j *Job) nodes(ctx context.Context) (map[string][]Node, error) {
	var all []*store.Node
	for lp := (store.ListParams{Limit: store.MaxListLimit}); ; {
		page, err := j.st.NodeSummaries(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("drift: list nodes: %w", err)
		}
		all = append(all, page...)
		if len(page) < lp.Limit {
			break
		}
		lp.Cursor = page[len(page)-1].ID
	}
	var stale []string
	seen := make(map[string]bool, len(all))
	for _, n := range all {
		seen[n.ID] = true
		if v, ok := j.known[n.ID]; !ok || v.digest != n.InventoryDigest || n.InventoryDigest == "" {
			stale = append(stale, n.ID)
		}
	}
	digests := make(map[string]string, len(all))
	for _, n := range all {
		digests[n.ID] = n.InventoryDigest
	}
	for i := 0; i < len(stale); i += store.MaxListLimit {
		ids := stale[i:min(i+store.MaxListLimit, len(stale))]
		invs, err := j.st.NodeInventories(ctx, ids)
		if err != nil {
			return nil, fmt.Errorf("drift: read inventories: %w", err)
		}
		for _, id := range ids {
			d, c := Versions(inventory.Decode(invs[id]))
			j.known[id] = versions{digest: digests[id], driver: d, cuda: c}
		}
	}
	for id := range j.known {
		if !seen[id] {
			delete(j.known, id)
		}
	}
	byPool := map[string][]Node{}
	for _, n := range all {
		v := j.known[n.ID]
		byPool[n.PoolID] = append(byPool[n.PoolID], Node{ID: n.ID, PoolID: n.PoolID, Driver: v.driver, CUDA: v.cuda,
			Label: n.Labels[Label]})
	}
	return byPool, nil
}

// Round judges each pool and writes what changed in one transaction under
// fence: a gpu.drift event and the label for each node whose drift started
// or changed, the label's removal and a KindEnded event for each whose
// drift ended. It returns the nodes that drift now, by pool. A lost fence
// writes nothing (store.ErrFenced).
func (j *Job) Round(ctx context.Context, fence store.Fence, now time.Time) (map[string][]string, error) {
	st, m, log := j.st, j.m, j.log
	byPool, err := j.nodes(ctx)
	if err != nil {
		return nil, err
	}
	type change struct {
		node    Node
		finding *sessionv1.GPUFinding // nil: the drift ended
	}
	var changes []change
	drifting := map[string][]string{}
	counts := map[string]int{}
	for _, pool := range slices.Sorted(maps.Keys(byPool)) {
		nodes := byPool[pool]
		found := Judge(nodes, now)
		counts[pool] = len(found)
		for _, n := range nodes {
			f := found[n.ID]
			if f != nil {
				drifting[pool] = append(drifting[pool], n.ID)
			}
			switch {
			case f != nil && Summary(f.GetDrift()) != n.Label:
				changes = append(changes, change{n, f})
			case f == nil && n.Label != "":
				changes = append(changes, change{n, nil})
			}
		}
	}
	if m != nil {
		m.NodesDrifting(counts)
	}
	if len(changes) == 0 {
		return drifting, nil
	}
	err = store.InFencedTx(ctx, st, fence, func(tx driftTx) error {
		for _, c := range changes {
			if c.finding == nil {
				if err := tx.NodeSetLabel(ctx, c.node.ID, Label, ""); err != nil {
					return fmt.Errorf("node %s: remove label: %w", c.node.ID, err)
				}
				msg := fmt.Sprintf("driver %s, CUDA %s no longer drift from the pool's: they match it, or the pool's nodes tie (was %s)",
					c.node.Driver, cmp.Or(c.node.CUDA, "-"), c.node.Label)
				if c.node.Driver == "" && c.node.CUDA == "" {
					msg = fmt.Sprintf("the node reports no driver or CUDA version (no GPU listed): its drift is no longer judged (was %s)",
						c.node.Label)
				}
				if _, err := tx.EventInsert(ctx, &store.Event{NodeID: c.node.ID, Kind: KindEnded, Severity: "info",
					Message: msg, Time: now}); err != nil {
					return fmt.Errorf("node %s: drift ended: %w", c.node.ID, err)
				}
				continue
			}
			line := Summary(c.finding.GetDrift())
			if err := tx.NodeSetLabel(ctx, c.node.ID, Label, line); err != nil {
				return fmt.Errorf("node %s: set label: %w", c.node.ID, err)
			}
			if _, err := tx.EventInsert(ctx, &store.Event{NodeID: c.node.ID, Kind: gpufinding.KindDrift, Severity: "warning",
				Message: c.finding.GetEvidence().GetMessage(), Time: now, GPUFinding: c.finding}); err != nil {
				return fmt.Errorf("node %s: drift finding: %w", c.node.ID, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, c := range changes {
		if c.finding == nil {
			log.InfoContext(ctx, "Node drift ended", logkey.NodeID, c.node.ID, attrDrift, c.node.Label)
		} else {
			log.InfoContext(ctx, "Node drifts from its pool", logkey.NodeID, c.node.ID, attrPool, c.node.PoolID,
				attrDrift, Summary(c.finding.GetDrift()))
		}
	}
	return drifting, nil
}
