package sim

import (
	"crypto/ecdsa"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/session"
)

// restore takes the key and identity kept in DaemonConfig.StateDir, when
// there are some whose certificate is still valid at now; otherwise the
// daemon keeps its fresh key and joins.
func (d *FakeDaemon) restore(now time.Time) error {
	if d.cfg.StateDir == "" {
		return nil
	}
	id, err := identity.NewStore(d.cfg.StateDir).Load()
	if errors.Is(err, identity.ErrNotJoined) {
		return nil
	}
	if err != nil {
		return err
	}
	key, ok := id.Key.(*ecdsa.PrivateKey)
	if !ok || len(id.Chain) == 0 || !now.Before(id.NotAfter()) || id.GatewayPin == "" {
		return nil // expired, or not a state this simulator wrote: join anew
	}
	d.key = key
	d.id = &session.JoinResult{NodeID: id.NodeID, TrustDomain: id.TrustDomain, SPIFFEID: id.SPIFFEID,
		Chain: id.Chain, NodeCARoots: id.NodeCARoots, Gateways: id.Gateways, RenewAfter: id.RenewAfter,
		Trust: id.Trust(), PoolID: id.PoolID, SiteID: id.SiteID, Region: id.Region, ReattestGrace: id.ReattestGrace}
	d.restored = true
	return nil
}

// keep saves what Join obtained in DaemonConfig.StateDir, when set and the
// gateways are trusted by pin (a join token's; what restore reads back).
func (d *FakeDaemon) keep(res *session.JoinResult) error {
	if d.cfg.StateDir == "" || res.Trust.Roots != nil {
		return nil
	}
	st := identity.NewStore(d.cfg.StateDir)
	if err := st.Prepare(); err != nil {
		return fmt.Errorf("fake daemon %s: keep identity: %w", d.cfg.Name, err)
	}
	if err := st.Save(identity.FromJoin(res, d.key, nil, time.Now())); err != nil {
		return fmt.Errorf("fake daemon %s: keep identity: %w", d.cfg.Name, err)
	}
	return nil
}
