package config

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Remediation configures the remediation reconciler of the controllers role
// (key remediation; docs/remediation.md).
type Remediation struct {
	// Disabled turns closed-loop remediation off: findings are recorded
	// by nobody and nothing is quarantined. Defaults to false (on).
	Disabled bool `yaml:"disabled"`
	// Interval is how often each shard's cases are advanced. Defaults to
	// 2 s.
	Interval Duration `yaml:"interval"`
	// Policy maps a finding to an action, first matching rule first; empty
	// takes DefaultRemediationPolicy. A finding no rule matches is
	// escalated.
	Policy []RemediationRule `yaml:"policy"`
	// MaxAttempts bounds the actions tried on one case (a failed gpu.reset
	// is followed by a reboot, a reboot whose node does not come back by a
	// BMC power cycle); past it the case is escalated. Defaults to 3.
	MaxAttempts int `yaml:"maxAttempts"`
	// DrainTimeout is how long running commands may take to finish before
	// the action starts anyway. Defaults to 10 min.
	DrainTimeout Duration `yaml:"drainTimeout"`
	// ActionTimeout is the deadline of an action's command. Defaults to
	// 10 min.
	ActionTimeout Duration `yaml:"actionTimeout"`
	// VerifySettle is how long a node must stay ready with healthy GPUs
	// and no new finding after an action before it returns to service.
	// Defaults to 30 s.
	VerifySettle Duration `yaml:"verifySettle"`
	// VerifyTimeout is how long after an action the node may take to
	// reconnect and read healthy; past it the action failed. Defaults to
	// 10 min.
	VerifyTimeout Duration `yaml:"verifyTimeout"`
	// Verify is the diagnostic a node's GPUs pass before the node returns
	// to service (docs/remediation.md, "Diagnostic before return").
	Verify RemediationVerify `yaml:"verify"`
	// Breaker is each pool's circuit breaker.
	Breaker RemediationBreaker `yaml:"breaker"`
	// Repeat holds a node for a person when faults come back
	// (docs/remediation.md, "Repeats").
	Repeat RemediationRepeat `yaml:"repeat"`
}

// Values of RemediationVerify.Diag.
const (
	// DiagNone runs no diagnostic: a node returns on its NVML health.
	DiagNone = "none"
	// DiagBuiltin runs only bcd's built-in NVML check.
	DiagBuiltin = "builtin"
)

// RemediationVerify is the diagnostic run on the node, once it reads
// healthy after an action and before it returns to service: NVIDIA DCGM's
// `dcgmi diag -r LEVEL` where the node has dcgmi, bcd's built-in NVML check
// (every GPU enumerates, reads its recovery action as none, and has no
// uncorrectable ECC error since the reset) where it has not. A diagnostic
// that fails, or cannot run, escalates the case with the node kept out of
// service (after NVIDIA NVSentinel's DCGM preflight).
type RemediationVerify struct {
	// Diag is the DCGM run level, "1" (quick), "2" (medium) or "3" (long),
	// "builtin" for the NVML check alone, or "none". Defaults to "1".
	Diag string `yaml:"diag"`
	// DiagTimeout is the diagnostic command's deadline. Defaults to 10 min
	// at levels 1 and builtin, 30 min at 2, 2 h at 3 (DCGM's level 3 runs
	// its stress tests for tens of minutes).
	DiagTimeout Duration `yaml:"diagTimeout"`
}

// DiagLevel returns the DCGM run level of GPUDiagSpec.level (0 for
// builtin) and whether a diagnostic runs at all.
func (v RemediationVerify) DiagLevel() (level uint32, run bool) {
	switch v.Diag {
	case DiagNone:
		return 0, false
	case DiagBuiltin:
		return 0, true
	}
	n, err := strconv.Atoi(v.Diag)
	if err != nil || n < 1 || n > 3 {
		return 1, true
	}
	return uint32(n), true
}

// RemediationRepeat are the repeat rules, read from the node's past cases
// in the database when a case opens: a finding the policy acts on
// (gpu.reset, reboot, power-cycle) on a GPU that a case acted on within
// Window holds the node for a person (after NVIDIA NVSentinel's
// RepeatedXIDErrorOnSameGPU), and so does one on a node whose cases took
// NodeActions automatic actions within Window (NVSentinel's
// MultipleRemediations, Meta GCM's cap on automatic actions).
type RemediationRepeat struct {
	// Window is how far back the rules look. Defaults to 24 h.
	Window Duration `yaml:"window"`
	// NodeActions is the most automatic actions (action commands) on one
	// node within Window; a finding that would take one more holds it.
	// Defaults to 3.
	NodeActions int `yaml:"nodeActions"`
	// Spacing is the least time between two automatic actions on one
	// node, doubling after each within Window (after Meta GCM's cooldown
	// per node): 10 min after the first, 20 after the second, ... A case
	// whose first action would come sooner waits in draining. Defaults to
	// 10 min.
	Spacing Duration `yaml:"spacing"`
	// ContactSupport is how many findings of a code that does not act
	// (its action none: IGNORE, RESTART_APP, XID 154), whose catalogue
	// investigatory resolution is CONTACT_SUPPORT, on one GPU within
	// Window open a case held for a person (NVSentinel's
	// RepeatedXIDErrorOnSameGPU figure). Defaults to 5.
	ContactSupport int `yaml:"contactSupport"`
}

// RemediationBreaker is each pool's circuit breaker, sized to the pool: at
// most max(MinNodes, Share of the pool's GPU nodes) distinct nodes acted on
// within a sliding Window (after NVIDIA NVSentinel's breaker, a share of
// the GPU nodes in a sliding window). The node past it trips the breaker:
// it and every later one is quarantined (cordoned, no new work) without
// any other action, and acted on in order when the breaker closes, by
// itself Window after the trip or by remediation reset-breaker.
type RemediationBreaker struct {
	// Share is the share of the pool's GPU nodes, in per cent (a number
	// such as 10 or 12.5, or "10%"), above 0 and at most 100. Defaults to
	// 10.
	Share Percent `yaml:"share"`
	// MinNodes is the fewest nodes the breaker admits within Window
	// whatever the share; at least 1. Defaults to 1.
	MinNodes int `yaml:"minNodes"`
	// Quarantines, when above 0, is an absolute cap on the nodes acted on
	// within Window on top of the share. Defaults to 0 (off).
	Quarantines int `yaml:"quarantines"`
	// Window is the sliding window, and how long a tripped breaker stays
	// tripped. Defaults to 10 min.
	Window Duration `yaml:"window"`
}

// Limit is the most distinct nodes acted on within Window in a pool of
// gpuNodes GPU nodes: max(MinNodes, floor(Share × gpuNodes / 100)),
// capped by Quarantines when that is set. Zero fields take the defaults.
func (b RemediationBreaker) Limit(gpuNodes int) int {
	share := float64(b.Share)
	if share == 0 {
		share = 10
	}
	n := max(b.MinNodes, 1, int(share*float64(gpuNodes)/100+1e-9))
	if b.Quarantines > 0 {
		n = min(n, b.Quarantines)
	}
	return n
}

// Percent is a share in per cent, read as a number (10, 12.5) or a string
// ending in % ("10%").
type Percent float64

// UnmarshalYAML reads 10, 12.5 or "10%".
func (p *Percent) UnmarshalYAML(n *yaml.Node) error {
	s := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(n.Value), "%"))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: %q is not a share in per cent, such as 10 or \"10%%\"", n.Line, n.Value)
	}
	*p = Percent(v)
	return nil
}

// The actions a remediation rule may name.
const (
	ActionNone       = "none"                 // the finding's event only
	ActionCordon     = "cordon"               // quarantine and leave it to a person, without escalating
	ActionGPUReset   = sessionv1.KindGPUReset // reset the GPU (the command of that kind)
	ActionReboot     = sessionv1.KindReboot   // reboot the node (the command of that kind)
	ActionPowerCycle = "power-cycle"          // power.cycle through the site's BMC agent
	ActionEscalate   = "escalate"             // quarantine and escalate to a person
)

// RemediationActions lists the actions, in the order of their strength.
var RemediationActions = []string{ActionNone, ActionCordon, ActionGPUReset, ActionReboot, ActionPowerCycle, ActionEscalate}

// The findings a rule may match besides a resolution.
const (
	FindingXID             = "xid"               // a gpu.xid event
	FindingECCUncorrected  = "ecc-uncorrected"   // the node's uncorrected ECC threshold was passed (gpu.ecc.uncorrected)
	FindingRowRemapFailure = "row-remap-failure" // a row could not be remapped (gpu.row-remap.failure)
	FindingGPULost         = "gpu-lost"          // a GPU is gone from the bus or NVML (gpu.lost)
	FindingUnresponsive    = "unresponsive"      // silent past the liveness window while its BMC says on
	FindingPoweredOff      = "powered-off"       // silent while its BMC says off
	FindingInfiniBand      = "infiniband"        // an InfiniBand/RoCE port or RDMA device (ib.port)
	FindingPersistenceMode = "persistence-mode"  // a GPU's persistence mode is off (gpu.persistence)
	FindingFabricManager   = "fabric-manager"    // nvidia-fabricmanager down or flapping (gpu.fabric-manager)
	FindingDrift           = "drift"             // the node's driver or CUDA version differs from its pool's (gpu.drift)
	FindingHealth          = "health"            // any other node judgement carrying a resolution
)

// RemediationFindings lists the findings.
var RemediationFindings = []string{FindingXID, FindingECCUncorrected, FindingRowRemapFailure, FindingGPULost,
	FindingUnresponsive, FindingPoweredOff, FindingInfiniBand, FindingPersistenceMode, FindingFabricManager, FindingDrift, FindingHealth}

// RemediationRule is one row of the policy: a finding matching every field
// given (none: every finding) takes Action.
type RemediationRule struct {
	// Resolution matches NVIDIA's resolution the node sent ("RESET_GPU",
	// "RESTART_BM", "ESCALATE", ...), upper case.
	Resolution string `yaml:"resolution"`
	// Finding matches one of RemediationFindings.
	Finding string `yaml:"finding"`
	// Action is one of RemediationActions. Required.
	Action string `yaml:"action"`
	// Line is the rule's line in the file, for errors (0 for the default).
	Line int `yaml:"-"`
}

// UnmarshalYAML decodes a rule and records its line.
func (r *RemediationRule) UnmarshalYAML(n *yaml.Node) error {
	type plain RemediationRule
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*r = RemediationRule(p)
	r.Line = n.Line
	return nil
}

// Matches reports whether the rule applies to a finding with resolution.
func (r RemediationRule) Matches(finding, resolution string) bool {
	return (r.Finding == "" || r.Finding == finding) && (r.Resolution == "" || r.Resolution == resolution)
}

// DefaultRemediationPolicy is the policy when none is configured, built from
// NVIDIA's immediate resolutions (docs/remediation.md, "The default
// policy"): IGNORE and RESTART_APP raise the event only; RESET_GPU resets
// the GPU; RESTART_BM and RESTART_VM reboot (bare metal); a failed row
// remap is escalated; uncorrected ECC past the node's threshold resets the
// GPU; a lost GPU reboots; a node silent while its BMC says on is power
// cycled, one its BMC says is off is left alone; an InfiniBand/RoCE port or
// RDMA device finding cordons the node (no GPU is at fault: no reset, no
// reboot; a person replaces the cable or port); persistence mode off
// (IGNORE) and a driver or CUDA version that drifts from the pool's
// (UPDATE_SWFW) raise the event only; everything else, ESCALATE (NVIDIA's
// blank and WORKFLOW_* resolutions, a fabric manager down or flapping) and
// CONTACT_SUPPORT included, is quarantined and escalated to a person.
var DefaultRemediationPolicy = []RemediationRule{
	{Resolution: "IGNORE", Action: ActionNone},
	{Resolution: "RESTART_APP", Action: ActionNone},
	{Finding: FindingRowRemapFailure, Action: ActionEscalate},
	{Finding: FindingUnresponsive, Action: ActionPowerCycle},
	{Finding: FindingPoweredOff, Action: ActionNone},
	{Finding: FindingPersistenceMode, Action: ActionNone},
	{Finding: FindingDrift, Action: ActionNone},
	{Finding: FindingECCUncorrected, Action: ActionGPUReset},
	{Finding: FindingGPULost, Action: ActionReboot},
	{Finding: FindingInfiniBand, Action: ActionCordon},
	{Resolution: "RESET_GPU", Action: ActionGPUReset},
	{Resolution: "RESTART_BM", Action: ActionReboot},
	{Resolution: "RESTART_VM", Action: ActionReboot},
	{Action: ActionEscalate},
}

var resolutionRE = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)

func (r *Remediation) defaults() {
	if r.Interval.Duration == 0 {
		r.Interval.Duration = 2 * time.Second
	}
	if len(r.Policy) == 0 {
		r.Policy = slices.Clone(DefaultRemediationPolicy)
	}
	if r.MaxAttempts == 0 {
		r.MaxAttempts = 3
	}
	if r.DrainTimeout.Duration == 0 {
		r.DrainTimeout.Duration = 10 * time.Minute
	}
	if r.ActionTimeout.Duration == 0 {
		r.ActionTimeout.Duration = 10 * time.Minute
	}
	if r.VerifySettle.Duration == 0 {
		r.VerifySettle.Duration = 30 * time.Second
	}
	if r.VerifyTimeout.Duration == 0 {
		r.VerifyTimeout.Duration = 10 * time.Minute
	}
	if r.Verify.Diag == "" {
		r.Verify.Diag = "1"
	}
	if r.Verify.DiagTimeout.Duration == 0 {
		r.Verify.DiagTimeout.Duration = map[string]time.Duration{"2": 30 * time.Minute, "3": 2 * time.Hour}[r.Verify.Diag]
		r.Verify.DiagTimeout.Duration = cmp.Or(r.Verify.DiagTimeout.Duration, 10*time.Minute)
	}
	if r.Breaker.Share == 0 {
		r.Breaker.Share = 10
	}
	if r.Breaker.MinNodes == 0 {
		r.Breaker.MinNodes = 1
	}
	if r.Breaker.Window.Duration == 0 {
		r.Breaker.Window.Duration = 10 * time.Minute
	}
	if r.Repeat.Window.Duration == 0 {
		r.Repeat.Window.Duration = 24 * time.Hour
	}
	if r.Repeat.NodeActions == 0 {
		r.Repeat.NodeActions = 3
	}
	if r.Repeat.Spacing.Duration == 0 {
		r.Repeat.Spacing.Duration = 10 * time.Minute
	}
	if r.Repeat.ContactSupport == 0 {
		r.Repeat.ContactSupport = 5
	}
}

// ValidateRemediationPolicy checks a policy: every rule names a known
// action, a known finding or a resolution in NVIDIA's spelling, no rule
// repeats an earlier one's match, and none follows a rule that matches
// everything (it could never apply). Errors name the key at fault
// (remediation.policy[2].action) and its line.
func ValidateRemediationPolicy(policy []RemediationRule) error {
	seen := map[[2]string]int{}
	for i, r := range policy {
		key := fmt.Sprintf("remediation.policy[%d]", i)
		at := ""
		if r.Line > 0 {
			at = fmt.Sprintf("line %d: ", r.Line)
		}
		if r.Action == "" {
			return &Error{Key: key + ".action", Msg: at + "is required: one of " + strings.Join(RemediationActions, ", ")}
		}
		if !slices.Contains(RemediationActions, r.Action) {
			return &Error{Key: key + ".action", Msg: fmt.Sprintf("%sunknown action %q: want one of %s", at, r.Action,
				strings.Join(RemediationActions, ", "))}
		}
		if r.Finding != "" && !slices.Contains(RemediationFindings, r.Finding) {
			return &Error{Key: key + ".finding", Msg: fmt.Sprintf("%sunknown finding %q: want one of %s", at, r.Finding,
				strings.Join(RemediationFindings, ", "))}
		}
		if r.Resolution != "" && !resolutionRE.MatchString(r.Resolution) {
			return &Error{Key: key + ".resolution", Msg: fmt.Sprintf("%s%q is not a resolution in NVIDIA's spelling, such as RESET_GPU or RESTART_BM", at, r.Resolution)}
		}
		m := [2]string{r.Finding, r.Resolution}
		if j, dup := seen[m]; dup {
			return &Error{Key: key, Msg: fmt.Sprintf("%smatches what remediation.policy[%d] already matches: it never applies", at, j)}
		}
		if j, all := seen[[2]string{}]; all {
			return &Error{Key: key, Msg: fmt.Sprintf("%sfollows remediation.policy[%d], which matches every finding: it never applies", at, j)}
		}
		seen[m] = i
	}
	return nil
}

func (r *Remediation) validate() error {
	if err := ValidateRemediationPolicy(r.Policy); err != nil {
		return err
	}
	if r.MaxAttempts < 1 || r.MaxAttempts > 10 {
		return &Error{Key: "remediation.maxAttempts", Msg: fmt.Sprintf("%d: want 1 to 10", r.MaxAttempts)}
	}
	if r.Breaker.Quarantines < 0 {
		return &Error{Key: "remediation.breaker.quarantines", Msg: fmt.Sprintf("%d: want 0 (off) or more", r.Breaker.Quarantines)}
	}
	if r.Breaker.Share <= 0 || r.Breaker.Share > 100 {
		return &Error{Key: "remediation.breaker.share", Msg: fmt.Sprintf("%v%%: want above 0%% and at most 100%%", float64(r.Breaker.Share))}
	}
	if r.Breaker.MinNodes < 1 || r.Breaker.MinNodes > 100000 {
		return &Error{Key: "remediation.breaker.minNodes", Msg: fmt.Sprintf("%d: want 1 to 100000", r.Breaker.MinNodes)}
	}
	if r.Repeat.NodeActions < 1 || r.Repeat.NodeActions > 100 {
		return &Error{Key: "remediation.repeat.nodeActions", Msg: fmt.Sprintf("%d: want 1 to 100", r.Repeat.NodeActions)}
	}
	if r.Repeat.ContactSupport < 1 || r.Repeat.ContactSupport > 100 {
		return &Error{Key: "remediation.repeat.contactSupport", Msg: fmt.Sprintf("%d: want 1 to 100", r.Repeat.ContactSupport)}
	}
	if r.Repeat.Window.Duration > 30*24*time.Hour {
		return &Error{Key: "remediation.repeat.window", Msg: fmt.Sprintf("%v: want at most 720h", r.Repeat.Window.Duration)}
	}
	for key, d := range map[string]time.Duration{"remediation.interval": r.Interval.Duration,
		"remediation.repeat.window": r.Repeat.Window.Duration, "remediation.repeat.spacing": r.Repeat.Spacing.Duration,
		"remediation.drainTimeout": r.DrainTimeout.Duration, "remediation.actionTimeout": r.ActionTimeout.Duration,
		"remediation.verifySettle": r.VerifySettle.Duration, "remediation.verifyTimeout": r.VerifyTimeout.Duration,
		"remediation.breaker.window": r.Breaker.Window.Duration} {
		if d <= 0 {
			return &Error{Key: key, Msg: fmt.Sprintf("%v: want a positive duration", d)}
		}
	}
	if !slices.Contains([]string{DiagNone, DiagBuiltin, "1", "2", "3"}, r.Verify.Diag) {
		return &Error{Key: "remediation.verify.diag", Msg: fmt.Sprintf("%q: want none, builtin, 1, 2 or 3 (a dcgmi diag run level)", r.Verify.Diag)}
	}
	if d := r.Verify.DiagTimeout.Duration; d <= 0 || d > 24*time.Hour {
		return &Error{Key: "remediation.verify.diagTimeout", Msg: fmt.Sprintf("%v: want a positive duration of at most 24h", d)}
	}
	if r.Repeat.Spacing.Duration > r.Repeat.Window.Duration {
		return &Error{Key: "remediation.repeat.spacing", Msg: fmt.Sprintf("%v: want at most remediation.repeat.window (%v)",
			r.Repeat.Spacing.Duration, r.Repeat.Window.Duration)}
	}
	if r.VerifySettle.Duration >= r.VerifyTimeout.Duration {
		return &Error{Key: "remediation.verifySettle", Msg: fmt.Sprintf("%v: want less than remediation.verifyTimeout (%v)",
			r.VerifySettle.Duration, r.VerifyTimeout.Duration)}
	}
	return nil
}
