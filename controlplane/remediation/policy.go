package remediation

import (
	"slices"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Policy maps a finding and its resolution to an action: the first rule of
// the configured table that matches (config.RemediationRule), escalate when
// none does. It holds no XID table: the node classifies each XID with
// NVIDIA's catalogue and sends the resolution; the policy acts on that.
type Policy struct {
	rules []config.RemediationRule
}

// NewPolicy checks rules (config.ValidateRemediationPolicy) and returns
// their Policy; no rules: config.DefaultRemediationPolicy.
func NewPolicy(rules []config.RemediationRule) (*Policy, error) {
	if len(rules) == 0 {
		rules = config.DefaultRemediationPolicy
	}
	if err := config.ValidateRemediationPolicy(rules); err != nil {
		return nil, err
	}
	return &Policy{rules: slices.Clone(rules)}, nil
}

// Action returns the action for finding with resolution: one of
// config.RemediationActions.
func (p *Policy) Action(finding, resolution string) string {
	for _, r := range p.rules {
		if r.Matches(finding, resolution) {
			return r.Action
		}
	}
	return config.ActionEscalate
}

// Named returns the action of the first rule that names resolution itself
// (a rule without a resolution does not count), "" when none does: how the
// catalogue's investigatory resolution is read on a repeat (repeat.go).
func (p *Policy) Named(resolution string) string {
	if resolution == "" {
		return ""
	}
	for _, r := range p.rules {
		if r.Resolution == resolution {
			return r.Action
		}
	}
	return ""
}

// FindingOf names the policy's finding (config.RemediationFindings) of a
// node's GPU finding by its signal: an XID is an xid, uncorrectable ECC
// errors an ecc-uncorrected, a failed row remapping a row-remap-failure, a
// lost GPU or one missing from the node's expected count a gpu-lost,
// an InfiniBand/RoCE port or RDMA device an infiniband, persistence mode
// off a persistence-mode, the fabric manager's service a fabric-manager, a
// driver or CUDA version off the pool's a drift, and any other signal
// (PCIe, a corrected-ECC spike, a
// pending remapping, a recovery action, clocks, NVLink, retired pages, one
// this version does not know) a health finding.
func FindingOf(f *sessionv1.GPUFinding) string {
	switch gpufinding.SignalOf(f) {
	case gpufinding.SignalXID:
		return config.FindingXID
	case gpufinding.SignalECC:
		if f.GetEcc().GetUncorrectable() {
			return config.FindingECCUncorrected
		}
	case gpufinding.SignalRowRemap:
		if f.GetRowRemap().GetFailure() {
			return config.FindingRowRemapFailure
		}
	case gpufinding.SignalGPULost, gpufinding.SignalGPUMissing:
		return config.FindingGPULost
	case gpufinding.SignalInfiniBand:
		return config.FindingInfiniBand
	case gpufinding.SignalPersistence:
		return config.FindingPersistenceMode
	case gpufinding.SignalFabricManager:
		return config.FindingFabricManager
	case gpufinding.SignalDrift:
		return config.FindingDrift
	}
	return config.FindingHealth
}

// ladder is the order actions are tried in when one fails: a GPU that does
// not come back from a reset (or that cannot be reset alone, on NVSwitch
// systems) is rebooted with its node, and a node that does not come back
// from a reboot is power cycled through its BMC.
var ladder = []string{config.ActionGPUReset, config.ActionReboot, config.ActionPowerCycle}

// nextAction returns the action after a failed one, "" when the ladder
// ends (or powerCycle is false and it would be next).
func nextAction(failed string, powerCycle bool) string {
	i := slices.Index(ladder, failed)
	if i < 0 || i+1 >= len(ladder) {
		return ""
	}
	next := ladder[i+1]
	if next == config.ActionPowerCycle && !powerCycle {
		return ""
	}
	return next
}
