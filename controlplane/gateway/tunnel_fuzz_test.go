package gateway

import (
	"fmt"
	"testing"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// opener is one OpenTunnel call in FuzzTunnelTable's model.
type opener struct {
	id, nodeID string
	p          *pendingTunnel
	conn       *nodeConn // once the node's stream was received
	done       bool      // returned: timed out, or its conn closed
}

// FuzzTunnelTable runs sequences of tunnel opens, node streams naming a
// tunnel id (each of two nodes naming its own tunnels' ids and the
// other's), timeouts, receipts and closes against the tunnel table, as
// OpenTunnel and the Tunnel handler use it (issue 28: a node naming
// another node's pending tunnel id panicked the gateway with "close of
// closed channel"). Invariants: nothing panics; a stream gets only a
// tunnel of its own node; a node's count is its openers not yet done; a
// tunnel id waits for one tunnel at a time.
func FuzzTunnelTable(f *testing.F) {
	// The crash of issue 28: node 0 opens tunnel 0, node 1 names it, the
	// opener times out.
	f.Add([]byte{0x00, 0x0b, 0x02})
	f.Add([]byte{0x00, 0x01, 0x03, 0x04, 0x04})
	f.Add([]byte{0x00, 0x08, 0x10, 0x11, 0x09, 0x02, 0x03, 0x0b, 0x04})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var tt tunnelTable
		var openers []*opener
		streams := 0
		for _, b := range ops {
			node := fmt.Sprint("node_", (b>>3)&1)
			id := fmt.Sprint("tun_", (b>>4)&3)
			pick := func() *opener {
				var live []*opener
				for _, o := range openers {
					if !o.done {
						live = append(live, o)
					}
				}
				if len(live) == 0 {
					return nil
				}
				return live[int(b>>3)%len(live)]
			}
			switch b % 5 {
			case 0: // OpenTunnel for node under id
				if !tt.reserve(node) {
					continue
				}
				p := &pendingTunnel{nodeID: node, stream: make(chan sessionv1.SessionService_TunnelServer, 1), done: make(chan struct{})}
				if !tt.add(id, p) {
					tt.release(node)
					continue
				}
				openers = append(openers, &opener{id: id, nodeID: node, p: p})
			case 1: // a stream of node names id
				p, other := tt.claim(id, node)
				if p != nil {
					if p.nodeID != node {
						t.Fatalf("a stream of %s was given %s's tunnel %s", node, p.nodeID, id)
					}
					if other {
						t.Fatal("claim returned a tunnel and other")
					}
					streams++
					p.stream <- nil // the handler hands its stream over once
				}
			case 2: // the opener's timeout
				o := pick()
				if o == nil || o.conn != nil {
					continue
				}
				if !tt.withdraw(o.id, o.p) {
					select {
					case <-o.p.stream:
					default:
					}
					close(o.p.done)
				}
				tt.release(o.nodeID)
				o.done = true
			case 3: // the opener receives the node's stream
				o := pick()
				if o == nil || o.conn != nil {
					continue
				}
				select {
				case st := <-o.p.stream:
					nodeID := o.nodeID
					o.conn = &nodeConn{stream: st, done: o.p.done, release: func() { tt.release(nodeID) }}
				default:
				}
			case 4: // the opener closes its tunnel (twice: harmless)
				o := pick()
				if o == nil || o.conn == nil {
					continue
				}
				o.conn.Close()
				o.conn.Close()
				o.done = true
			}
			// A node's count is its openers not yet done.
			want := map[string]int{}
			for _, o := range openers {
				if !o.done {
					want[o.nodeID]++
				}
			}
			tt.mu.Lock()
			for n, c := range tt.perNode {
				if c != want[n] {
					tt.mu.Unlock()
					t.Fatalf("node %s counts %d tunnels, has %d openers waiting or open", n, c, want[n])
				}
			}
			for n, c := range want {
				if tt.perNode[n] != c {
					tt.mu.Unlock()
					t.Fatalf("node %s counts %d tunnels, has %d openers waiting or open", n, tt.perNode[n], c)
				}
			}
			for id, p := range tt.pending {
				if p.nodeID == "" {
					tt.mu.Unlock()
					t.Fatalf("tunnel %s waits for no node", id)
				}
			}
			tt.mu.Unlock()
		}
	})
}
