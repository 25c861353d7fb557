// Package healthgate decides whether the nodes a rollout's wave upgraded
// are less healthy than a comparison group (issue 30, item 3: health-gated
// waves; DESIGN.md, "Memory and evidence"; docs/rollouts.md, "Health
// gate").
//
// Each measure is a count of events over an exposure: bcd restarts and
// session drops per node-hour, new GPU health findings per GPU-hour, failed
// commands per command. The comparison group's rate (its count over its
// exposure) predicts how many events the upgraded group should have seen
// over its own exposure; the upgraded group is worse on a measure when its
// count exceeds that prediction by at least Params.MinExcess events and a
// one-sided Poisson test rejects the prediction at Params.Alpha:
//
//	expected = comparison.Count / comparison.Exposure * upgraded.Exposure
//	p        = P(X >= upgraded.Count), X ~ Poisson(expected)
//	worse    = upgraded.Count - expected >= MinExcess && p < Alpha
//
// The rule is the exact (conditional on the prediction) Poisson test of
// an observed count against an expected rate (Przyborowski and Wilenski,
// 1940; the test behind R's poisson.test with alternative "greater"), with
// the comparison group's rate taken as known. MinExcess keeps one or two
// stray events on a quiet fleet (where the prediction is near 0 and any
// event is "significant") from halting a rollout.
//
// A wave is halted on evidence of harm; it passes only on evidence of no
// harm: both groups must have been watched for at least
// Params.MinNodeHours, otherwise the verdict is inconclusive.
package healthgate

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Verdicts of a wave's health gate.
const (
	// Pass: no measure of the upgraded group is worse, and both groups
	// were watched long enough to say so.
	Pass = "pass"
	// Halt: a measure of the upgraded group is worse (Result.Worse).
	Halt = "halt"
	// Inconclusive: no measure is worse, but a group was watched for
	// fewer than Params.MinNodeHours node-hours.
	Inconclusive = "inconclusive"
)

// Defaults of Params (rollouts.healthGate.* in the configuration).
const (
	// DefaultAlpha is the one-sided significance level.
	DefaultAlpha = 0.01
	// DefaultMinExcess is how many events above the prediction a halt
	// needs at least.
	DefaultMinExcess = 2.0
	// DefaultMinNodeHours is how many node-hours each group needs for a
	// pass.
	DefaultMinNodeHours = 1.0
)

// Params are the gate's thresholds.
type Params struct {
	// Alpha is the significance level of the one-sided Poisson test, in
	// (0, 1); 0 means DefaultAlpha.
	Alpha float64
	// MinExcess is the least excess of events over the prediction that
	// halts, at least 0; 0 means DefaultMinExcess (use a tiny positive
	// number for "any").
	MinExcess float64
	// MinNodeHours is how many node-hours each group must be watched for
	// a pass; 0 means DefaultMinNodeHours.
	MinNodeHours float64
}

// withDefaults fills in the zero fields.
func (p Params) withDefaults() Params {
	if p.Alpha == 0 {
		p.Alpha = DefaultAlpha
	}
	if p.MinExcess == 0 {
		p.MinExcess = DefaultMinExcess
	}
	if p.MinNodeHours == 0 {
		p.MinNodeHours = DefaultMinNodeHours
	}
	return p
}

// Validate checks the thresholds (after defaults), naming the one wrong.
func (p Params) Validate() error {
	p = p.withDefaults()
	switch {
	case !(p.Alpha > 0 && p.Alpha < 1):
		return fmt.Errorf("alpha %v: want a significance level between 0 and 1 (0.01)", p.Alpha)
	case !(p.MinExcess > 0) || math.IsInf(p.MinExcess, 0):
		return fmt.Errorf("minExcess %v: want a positive number of events (2)", p.MinExcess)
	case !(p.MinNodeHours > 0) || math.IsInf(p.MinNodeHours, 0):
		return fmt.Errorf("minNodeHours %v: want a positive number of node-hours (1)", p.MinNodeHours)
	}
	return nil
}

// Group is one group's figures on a measure: Count events over Exposure
// (node-hours, GPU-hours or commands, as the measure's Unit says).
type Group struct {
	Count    int64   `json:"count"`
	Exposure float64 `json:"exposure"`
}

// Rate is Count per unit of Exposure (0 without exposure).
func (g Group) Rate() float64 {
	if g.Exposure <= 0 {
		return 0
	}
	return float64(g.Count) / g.Exposure
}

// Measure is one measure of both groups.
type Measure struct {
	// Name is "restarts", "session-drops", "findings" or
	// "failed-commands"; Unit what Exposure counts: "node-hour",
	// "GPU-hour" or "command".
	Name       string `json:"name"`
	Unit       string `json:"unit"`
	Upgraded   Group  `json:"upgraded"`
	Comparison Group  `json:"comparison"`
}

// Result is a measure tested: Expected is the upgraded group's count the
// comparison group's rate predicts, P the one-sided Poisson p-value of
// the upgraded group's count against it, Worse whether the measure
// halts. Skipped says the measure could not be tested (a group without
// exposure: no commands ran, no GPUs); it is never Worse.
type Result struct {
	Measure
	Expected float64 `json:"expected"`
	P        float64 `json:"p"`
	Worse    bool    `json:"worse"`
	Skipped  bool    `json:"skipped,omitempty"`
}

// Test tests one measure with p's thresholds.
func Test(m Measure, p Params) Result {
	p = p.withDefaults()
	r := Result{Measure: m, P: 1}
	if m.Upgraded.Exposure <= 0 || m.Comparison.Exposure <= 0 {
		r.Skipped = true
		return r
	}
	r.Expected = m.Comparison.Rate() * m.Upgraded.Exposure
	r.P = PoissonUpperTail(m.Upgraded.Count, r.Expected)
	r.Worse = float64(m.Upgraded.Count)-r.Expected >= p.MinExcess && r.P < p.Alpha
	return r
}

// Decide is the gate's verdict on a wave from its measures' results and
// each group's node-hours: Halt when a measure is worse (with the
// comparison group watched for at least MinNodeHours: its rate must mean
// something), Pass when none is and both groups were watched for at least
// MinNodeHours, Inconclusive otherwise.
func Decide(results []Result, upgradedNodeHours, comparisonNodeHours float64, p Params) string {
	p = p.withDefaults()
	if comparisonNodeHours < p.MinNodeHours {
		return Inconclusive
	}
	for _, r := range results {
		if r.Worse {
			return Halt
		}
	}
	if upgradedNodeHours < p.MinNodeHours {
		return Inconclusive
	}
	return Pass
}

// PoissonUpperTail is P(X >= k) for X ~ Poisson(lambda), computed from the
// probability mass function term by term in log space (no normal
// approximation): the lower sum subtracted from 1 when k <= lambda, where
// that sum is small, else the upper terms summed until they no longer
// change the total. It is 1 for k <= 0, and 0 for k > 0 when lambda is 0.
func PoissonUpperTail(k int64, lambda float64) float64 {
	switch {
	case k <= 0:
		return 1
	case lambda <= 0:
		return 0
	case math.IsInf(lambda, 1) || math.IsNaN(lambda):
		return 1
	}
	term := func(i int64) float64 {
		lg, _ := math.Lgamma(float64(i) + 1)
		return math.Exp(-lambda + float64(i)*math.Log(lambda) - lg)
	}
	if float64(k) <= lambda {
		lower := 0.0
		for i := int64(0); i < k; i++ {
			lower += term(i)
		}
		return math.Max(0, math.Min(1, 1-lower))
	}
	// Terms fall from i = k on (k > lambda): sum until they are
	// negligible against the total.
	sum := 0.0
	for i := k; ; i++ {
		t := term(i)
		sum += t
		if t == 0 || t < sum*1e-17 {
			break
		}
	}
	return math.Min(1, sum)
}

// Comparison groups of a Report.
const (
	// ComparisonNotUpgraded: the pool's nodes not yet upgraded, over the
	// same window.
	ComparisonNotUpgraded = "not-upgraded"
	// ComparisonBeforeUpgrade: none remain; the wave's own nodes over an
	// equal window before their upgrade.
	ComparisonBeforeUpgrade = "before-upgrade"
)

// Report is a wave's health gate as a rollout records it (rollouts get,
// the rollout.wave-completed event): both groups, each measure's figures
// and test, and the verdict.
type Report struct {
	Wave int `json:"wave"`
	// Verdict is Pass, Halt or Inconclusive.
	Verdict string `json:"verdict"`
	// Comparison is ComparisonNotUpgraded or ComparisonBeforeUpgrade.
	Comparison string `json:"comparison"`
	// From and To bound the window: the first soak start of the wave's
	// upgraded nodes, and when the gate was decided.
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// The groups' sizes (nodes) and node-hours.
	UpgradedNodes       int      `json:"upgradedNodes"`
	ComparisonNodes     int      `json:"comparisonNodes"`
	UpgradedNodeHours   float64  `json:"upgradedNodeHours"`
	ComparisonNodeHours float64  `json:"comparisonNodeHours"`
	Measures            []Result `json:"measures"`
	// ExtendedUntil is set when an inconclusive verdict extended the soak
	// (once); Pending says the extension runs: the gate is decided again
	// at ExtendedUntil.
	ExtendedUntil *time.Time `json:"extendedUntil,omitempty"`
	Pending       bool       `json:"pending,omitempty"`
	// Reason says the verdict in one line.
	Reason string `json:"reason"`
}

// Summary says the measures that are worse, or the verdict, in one line:
// "findings: 31 in 0.07 GPU-hour(s), expected 0.00 (p 1.2e-45)".
func (r *Report) Summary() string {
	var worse []string
	for _, m := range r.Measures {
		if m.Worse {
			worse = append(worse, fmt.Sprintf("%s: %d in %.3g %s(s), expected %.2f from %d in %.3g (p %.2g)", m.Name, m.Upgraded.Count,
				m.Upgraded.Exposure, m.Unit, m.Expected, m.Comparison.Count, m.Comparison.Exposure, m.P))
		}
	}
	if len(worse) > 0 {
		return strings.Join(worse, "; ")
	}
	return fmt.Sprintf("%s: %d upgraded node(s), %.3g node-hour(s), against %d %s node(s), %.3g node-hour(s)", r.Verdict,
		r.UpgradedNodes, r.UpgradedNodeHours, r.ComparisonNodes, r.Comparison, r.ComparisonNodeHours)
}
