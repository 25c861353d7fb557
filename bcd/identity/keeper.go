package identity

import (
	"context"
	"crypto/x509"
	"slices"
	"sync"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// Keeper keeps a running node's identity in its Store as the session
// learns of changes: it is the session.IdentityKeeper of bcd run and of
// an upgrade's trial. Changes to the Identity and its files are made one
// at a time (a renewal and a Welcome's gateway list may arrive at once).
type Keeper struct {
	mu    sync.Mutex
	id    *Identity
	store *Store
}

// NewKeeper returns a Keeper that applies changes to id and writes them
// to store.
func NewKeeper(store *Store, id *Identity) *Keeper { return &Keeper{id: id, store: store} }

// KeepRenewal applies a renewal to the Identity and writes its certificate
// chain, node CA roots and renew-after time (Store.SaveRenewal).
func (k *Keeper) KeepRenewal(_ context.Context, r *session.Renewal) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.id.Renewed(r)
	return k.store.SaveRenewal(k.id)
}

// KeepGateways writes the gateway list a Welcome changed
// (Store.SaveGateways).
func (k *Keeper) KeepGateways(_ context.Context, known []session.KnownGateway) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.id.KnownGateways = known
	return k.store.SaveGateways(k.id)
}

// KeepBundle writes the node CA roots a node-CA rotation's Bundle carried
// (Store.SaveNodeCARoots).
func (k *Keeper) KeepBundle(_ context.Context, roots []*x509.Certificate) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.id.NodeCARoots = roots
	return k.store.SaveNodeCARoots(k.id)
}

// KeepGatewayRoots adds the gateway serving CAs of a gateway-CA rotation's
// Bundle to how the node trusts gateways, their pins or, for a node that
// joined with a CA file, the certificates, and writes them
// (Store.SaveGatewayTrust). It implements session.GatewayRootsKeeper.
func (k *Keeper) KeepGatewayRoots(_ context.Context, roots []*x509.Certificate) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.id.GatewayPin != "" {
		for _, r := range roots {
			if pin := jointoken.Pin(r); pin != k.id.GatewayPin && !slices.Contains(k.id.GatewayPins, pin) {
				k.id.GatewayPins = append(k.id.GatewayPins, pin)
			}
		}
	} else {
		for _, r := range roots {
			if !slices.ContainsFunc(k.id.GatewayCAs, r.Equal) {
				k.id.GatewayCAs = append(k.id.GatewayCAs, r)
			}
		}
	}
	return k.store.SaveGatewayTrust(k.id)
}
