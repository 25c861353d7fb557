package gateway

import "sync"

// registry holds the gateway's sessions, at most one per node.
type registry struct {
	mu     sync.Mutex
	byNode map[string]*session
}

// add makes s its node's session here and returns the one it replaces. When
// the node already has a newer session here (a higher epoch), s is not added
// and current is false.
func (r *registry) add(s *session) (replaced *session, current bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.byNode[s.nodeID]
	if old != nil && old.epoch > s.epoch {
		return nil, false
	}
	r.byNode[s.nodeID] = s
	return old, true
}

// remove forgets s unless a newer session replaced it.
func (r *registry) remove(s *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byNode[s.nodeID] == s {
		delete(r.byNode, s.nodeID)
	}
}

// get returns the node's session here, or nil.
func (r *registry) get(nodeID string) *session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byNode[nodeID]
}

// snapshot returns every session.
func (r *registry) snapshot() []*session {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*session, 0, len(r.byNode))
	for _, s := range r.byNode {
		out = append(out, s)
	}
	return out
}

func (r *registry) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byNode)
}

// renewed records that the node's session here answers to a new
// certificate serial.
func (r *registry) renewed(nodeID, serial string) {
	if s := r.get(nodeID); s != nil {
		s.serial.Store(&serial)
	}
}
