package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/time/rate"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/gpucount"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Limits on what a node sends in a session.
const (
	maxCapabilities   = 64
	maxCapabilityLen  = 64
	maxFactLen        = 128
	maxDigestLen      = 128
	maxEventKindLen   = 64
	maxEventMessage   = 1024
	maxEventAttrs     = 32
	maxEventAttrLen   = 256
	maxInventoryBytes = 1 << 20
	// maxRollbackReason and maxRollbackStarts bound Hello's LocalRollback.
	maxRollbackReason = 512
	maxRollbackStarts = 1000
	// writeRate and writeBurst bound the inventory and event writes one
	// session causes, so a misbehaving node cannot flood the database.
	writeRate  = rate.Limit(1)
	writeBurst = 20
)

// helloInfo is what the gateway keeps of Hello, checked.
type helloInfo struct {
	// capabilities in force: those of Hello the gateway supports, in
	// Hello's order, without duplicates.
	capabilities []string
	// bcdVersion, os and arch are Hello's when well-formed, else empty.
	bcdVersion, os, arch string
	// bootID is Hello's boot id when well-formed, else empty (as from an
	// older bcd, which sends none).
	bootID string
	// rollback is Hello's LocalRollback, checked; nil when absent or
	// malformed.
	rollback *store.NodeRolledBackLocallyParams
	// fresh: Hello resumes no session, so a new bcd process sent it (a
	// start, a restart, an upgrade's re-exec), not a reconnect.
	fresh bool
}

// negotiate checks Hello and picks the capabilities in force. It never
// fails: what is malformed is ignored.
func (g *Gateway) negotiate(h *sessionv1.Hello) *helloInfo {
	info := &helloInfo{capabilities: []string{}}
	for i, c := range h.GetCapabilities() {
		if i >= maxCapabilities {
			break
		}
		if len(c) > maxCapabilityLen || !g.caps[c] || slices.Contains(info.capabilities, c) {
			continue
		}
		info.capabilities = append(info.capabilities, c)
	}
	if text(h.GetBcdVersion(), maxFactLen) && text(h.GetOs(), maxFactLen) && text(h.GetArch(), maxFactLen) {
		info.bcdVersion, info.os, info.arch = h.GetBcdVersion(), h.GetOs(), h.GetArch()
	}
	if text(h.GetBootId(), maxFactLen) {
		info.bootID = h.GetBootId()
	}
	info.rollback = localRollback(h.GetLocalRollback())
	info.fresh = h.GetResume().GetSessionId() == ""
	return info
}

// localRollback checks Hello's LocalRollback (issue 30): nil when absent
// or malformed (a version that is not short text, a time outside the
// protocol's range); the reason is cut and cleaned, starts capped.
func localRollback(r *sessionv1.LocalRollback) *store.NodeRolledBackLocallyParams {
	if r == nil || r.GetFromVersion() == "" || !text(r.GetFromVersion(), maxFactLen) || !text(r.GetToVersion(), maxFactLen) ||
		(r.RolledBackAt != nil && r.GetRolledBackAt().CheckValid() != nil) {
		return nil
	}
	return &store.NodeRolledBackLocallyParams{FromVersion: r.GetFromVersion(), ToVersion: r.GetToVersion(),
		Reason: clean(r.GetReason(), maxRollbackReason), Starts: int(min(r.GetStarts(), maxRollbackStarts)),
		RolledBackAt: r.GetRolledBackAt().AsTime()}
}

// changes reports whether Hello says something new about node n.
func (h *helloInfo) changes(n *store.Node) bool {
	if h.bcdVersion == "" && h.os == "" && h.arch == "" {
		return false
	}
	return h.bcdVersion != n.BCDVersion || h.os != n.OS || h.arch != n.Arch
}

// handle acts on one message of an open session. Any message proves the
// node alive. Malformed content is dropped; nothing a node sends can end the
// session or fail the gateway.
func (g *Gateway) handle(ctx context.Context, s *session, m *sessionv1.NodeMessage) {
	g.pending.beat(s.id)
	switch b := m.GetBody().(type) {
	case *sessionv1.NodeMessage_Inventory:
		g.inventory(ctx, s, b.Inventory)
	case *sessionv1.NodeMessage_Event:
		g.event(ctx, s, b.Event)
	case *sessionv1.NodeMessage_CommandUpdate:
		g.queueUpdate(ctx, s.nodeID, b.CommandUpdate)
	case *sessionv1.NodeMessage_Heartbeat:
		now := g.cfg.Clock.Now()
		if !s.lastBeat.IsZero() {
			g.cfg.Metrics.HeartbeatReceived(g.cfg.ID, now.Sub(s.lastBeat), g.cfg.HeartbeatInterval)
		}
		s.lastBeat = now
		g.measureSkew(s, b.Heartbeat, now)
	case *sessionv1.NodeMessage_BundleAck:
		g.bundleAck(s, b.BundleAck)
	case *sessionv1.NodeMessage_ReleasePinsHeld:
		g.releasePinsHeld(ctx, s, b.ReleasePinsHeld)
	case *sessionv1.NodeMessage_Hello:
		// A second Hello changes nothing.
	default:
		// A body this gateway does not know (a newer node): skipped.
	}
}

// allowWrite reports whether the session may cause another write now.
func (s *session) allowWrite() bool {
	if s.writes == nil {
		s.writes = rate.NewLimiter(writeRate, writeBurst)
	}
	return s.writes.Allow()
}

// inventory stores a node's inventory when its digest is new.
func (g *Gateway) inventory(ctx context.Context, s *session, inv *sessionv1.Inventory) {
	digest := inv.GetDigest()
	if digest == "" || !text(digest, maxDigestLen) || digest == s.inventoryDigest {
		return
	}
	doc, err := protojson.Marshal(inv)
	if err != nil || len(doc) > maxInventoryBytes {
		g.warnNode(ctx, s, "Inventory dropped", "bytes", len(doc), logkey.Err, err)
		return
	}
	if !s.allowWrite() {
		g.warnNode(ctx, s, "Inventory dropped: too many writes")
		return
	}
	g.inventories.put(s.nodeID, inventoryWrite{doc: doc, digest: digest, gpus: gpusSeen(inv), at: g.cfg.Clock.Now().UTC()})
	s.inventoryDigest = digest
	g.checkGPUCount(ctx, s, inv)
}

// checkGPUCount judges inv against the node's expected GPU count
// (package gpucount): the first full inventory of a node without one sets
// it; one listing fewer GPUs stores a gpu.missing finding for each missing
// GPU, once per session while it stays missing, through the same path as
// a node's own GPU findings (events, gpu.health-changed, remediation).
func (g *Gateway) checkGPUCount(ctx context.Context, s *session, inv *sessionv1.Inventory) {
	if !gpucount.Full(inv) {
		return
	}
	node, err := g.store.NodeGet(ctx, s.nodeID)
	if err != nil {
		g.warnNode(ctx, s, "GPU count not checked", logkey.Err, err)
		return
	}
	expected, ok := gpucount.Expected(node.Labels)
	if !ok {
		if err := g.store.NodeSetLabel(ctx, s.nodeID, gpucount.Label, strconv.Itoa(len(inv.GetGpus()))); err != nil {
			g.warnNode(ctx, s, "Expected GPU count not recorded", logkey.Err, err)
		}
		return
	}
	missing := gpucount.Missing(inv, expected, g.cfg.Clock.Now().UTC())
	if len(missing) == 0 {
		s.missingSent = nil
		return
	}
	for _, f := range missing {
		if s.missingSent[f.GetGpuUuid()] {
			continue
		}
		ev := &store.Event{NodeID: s.nodeID, Kind: gpufinding.KindGPUMissing, Severity: "critical",
			Message: f.GetEvidence().GetMessage(), Time: g.cfg.Clock.Now().UTC(), GPUFinding: f}
		if _, err := g.store.EventInsert(ctx, ev); err != nil {
			g.warnNode(ctx, s, "Event not stored", "kind", ev.Kind, logkey.Err, err)
			continue
		}
		if s.missingSent == nil {
			s.missingSent = map[string]bool{}
		}
		s.missingSent[f.GetGpuUuid()] = true
	}
}

// severities maps the protocol's severities to the events table's words.
var severities = map[sessionv1.Severity]string{
	sessionv1.Severity_SEVERITY_INFO:     "info",
	sessionv1.Severity_SEVERITY_WARNING:  "warning",
	sessionv1.Severity_SEVERITY_ERROR:    "error",
	sessionv1.Severity_SEVERITY_CRITICAL: "critical",
}

// eventPayload is the JSON payload of a node event that is not about a GPU.
type eventPayload struct {
	Attributes map[string]string `json:"attributes,omitempty"`
	NodeTime   *time.Time        `json:"nodeTime,omitempty"`
}

// gpuEvent reports whether e is about a GPU: it carries a typed finding, or
// (from a bcd that predates it) names a GPU, an XID or a resolution.
func gpuEvent(e *sessionv1.Event) bool {
	return e.GetGpuFinding() != nil || e.GetGpuUuid() != "" || e.GetXid() != 0 || e.GetResolution() != ""
}

// event records a node event. The event's time is the gateway's clock; the
// node's own clock is kept in the payload. A GPU event's payload is its
// typed finding as sent (gpufinding.FromEvent), stored unchanged once it
// keeps gpufinding.Check's bounds: the store writes gpu.health-changed and
// the remediation inbox from it.
func (g *Gateway) event(ctx context.Context, s *session, e *sessionv1.Event) {
	kind := e.GetKind()
	if kind == "" || !text(kind, maxEventKindLen) {
		return
	}
	if !s.allowWrite() {
		g.warnNode(ctx, s, "Event dropped: too many writes", "kind", kind)
		return
	}
	sev, ok := severities[e.GetSeverity()]
	if !ok {
		sev = "info"
	}
	ev := &store.Event{NodeID: s.nodeID, Kind: kind, Severity: sev, Message: clean(e.GetMessage(), maxEventMessage),
		Time: g.cfg.Clock.Now().UTC()}
	if gpuEvent(e) {
		f := gpufinding.FromEvent(e)
		if err := gpufinding.Check(f); err != nil {
			g.warnNode(ctx, s, "Event dropped", "kind", kind, logkey.Err, err)
			return
		}
		ev.GPUFinding = f
		if x := f.GetXid(); x != nil && (f.GetResolution() == "IGNORE" || f.GetResolution() == "RESTART_APP") {
			g.cfg.Metrics.XIDNoAction(x.GetCode())
		}
	} else if ev.Payload = g.eventPayload(e); ev.Payload == nil {
		return
	}
	if _, err := g.store.EventInsert(ctx, ev); err != nil {
		g.warnNode(ctx, s, "Event not stored", "kind", kind, logkey.Err, err)
	}
}

// eventPayload is the payload of a node event not about a GPU: its
// attributes and the node's time, each within its bound; nil when it
// cannot be encoded.
func (g *Gateway) eventPayload(e *sessionv1.Event) []byte {
	var p eventPayload
	for k, v := range e.GetAttributes() {
		if len(p.Attributes) >= maxEventAttrs {
			break
		}
		if k != "" && text(k, maxEventAttrLen) && text(v, maxEventAttrLen) {
			if p.Attributes == nil {
				p.Attributes = map[string]string{}
			}
			p.Attributes[k] = v
		}
	}
	if ts := e.GetTime(); ts != nil && ts.CheckValid() == nil {
		t := ts.AsTime().UTC()
		p.NodeTime = &t
	}
	payload, err := json.Marshal(p)
	if err != nil {
		return nil
	}
	return payload
}

// text reports whether s is at most max bytes of valid UTF-8 without
// control characters.
func text(s string, max int) bool {
	if len(s) > max || !utf8.ValidString(s) {
		return false
	}
	return strings.IndexFunc(s, unicode.IsControl) < 0
}

// clean cuts s to at most max bytes of valid UTF-8 and replaces control
// characters with spaces.
func clean(s string, max int) string {
	if len(s) > max {
		s = s[:max]
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}
