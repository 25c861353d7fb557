// Package rotation rotates the node CA in phases stored in the database,
// advancing on proof that the live fleet holds the new bundle (DESIGN.md,
// "CA rotation"; docs/pki.md, "Rotating the node CA").
//
// A rotation starts propagating: the next node CA is made and sealed in the
// bundle (pki.Bundle.PrepareNodeCA), so every gateway, which reloads the
// bundle from the database, trusts old and new, and each node acknowledges
// the new bundle in its session (store.PKIRotationAck). It is activated
// when the acknowledged share of live nodes reaches the rotation's
// threshold (default DefaultThreshold): the new CA issues from then on, at
// each node's next renewal. It is retired when no node's valid certificate
// comes from another CA than the new one, or once Config.RetireGrace has
// passed since activation: the old root then verifies re-attestation only.
// Rollback from propagating or activated makes the old CA the issuer again.
//
// The gateway serving CA rotates the same way (Config.CA
// store.RotationCAGateway; docs/pki.md, "Rotating the gateway CA"): while
// propagating, nodes are sent the gateway CA roots and join tokens pin both
// CAs; activated, gateways serve from the new CA a chain the old pin still
// verifies; retired, from the new CA alone, once every live node
// acknowledged and no join token made before the start (OldPinTokens) can
// still be used. A forced retirement revokes those tokens, audited
// (AuditTokenRevoked). Only the node CA starts by itself (AutoRotate).
//
// Every phase change is one transaction: the bundle, the rotation's row,
// its event (pki.rotation-*) and an audit row. A change whose condition does
// not hold is refused with a *NotReadyError saying what is missing, unless
// forced. The Rotator holds no state of its own; any number of api
// processes and one reconciler may call it at once, and the database
// serialises them (a rotation moves only from the phase it is read in).
package rotation
