package remediation

import (
	"slices"
	"strings"

	"github.com/better-compute/better-compute/controlplane/config"
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

// FindingOf names the finding of a node event kind: gpu.xid is an xid,
// gpu.ecc.* an ecc-uncorrected, gpu.row-remap.failure (or any kind naming
// row-remap) a row-remap-failure, gpu.lost a gpu-lost, and any other kind
// that carries a resolution a health finding.
func FindingOf(kind string) string {
	switch {
	case kind == "gpu.xid":
		return config.FindingXID
	case strings.HasPrefix(kind, "gpu.ecc"):
		return config.FindingECCUncorrected
	case strings.Contains(kind, "row-remap"):
		return config.FindingRowRemapFailure
	case kind == "gpu.lost":
		return config.FindingGPULost
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
