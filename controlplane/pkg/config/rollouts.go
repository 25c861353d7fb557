package config

import (
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
)

// Rollouts configures the rollout reconciler of the controllers role (key
// rollouts; docs/rollouts.md).
type Rollouts struct {
	// Interval is how often each shard's active rollouts are stepped.
	// Defaults to 1 s; at most 1 min.
	Interval Duration `yaml:"interval"`
	// HealthGate sets the thresholds of the waves' health gate (issue 30;
	// docs/rollouts.md, "Health gate").
	HealthGate HealthGate `yaml:"healthGate"`
}

// HealthGate is rollouts.healthGate: package healthgate's Params.
type HealthGate struct {
	// Alpha is the one-sided Poisson test's significance level: 0.01, in
	// (0, 1).
	Alpha float64 `yaml:"alpha"`
	// MinExcess is how many events above what the comparison group
	// predicts a halt needs at least: 2, positive.
	MinExcess float64 `yaml:"minExcess"`
	// MinNodeHours is how many node-hours each group must be watched
	// for a pass: 1, positive.
	MinNodeHours float64 `yaml:"minNodeHours"`
}

// Params returns the thresholds as package healthgate takes them.
func (h HealthGate) Params() healthgate.Params {
	return healthgate.Params{Alpha: h.Alpha, MinExcess: h.MinExcess, MinNodeHours: h.MinNodeHours}
}

func (r *Rollouts) defaults() {
	if r.Interval.Duration == 0 {
		r.Interval.Duration = time.Second
	}
	h := &r.HealthGate
	if h.Alpha == 0 {
		h.Alpha = healthgate.DefaultAlpha
	}
	if h.MinExcess == 0 {
		h.MinExcess = healthgate.DefaultMinExcess
	}
	if h.MinNodeHours == 0 {
		h.MinNodeHours = healthgate.DefaultMinNodeHours
	}
}

func (r *Rollouts) validate() error {
	if d := r.Interval.Duration; d < 10*time.Millisecond || d > time.Minute {
		return &Error{Key: "rollouts.interval", Msg: "want 10ms to 1m"}
	}
	h := r.HealthGate
	switch {
	case !(h.Alpha > 0 && h.Alpha < 1):
		return &Error{Key: "rollouts.healthGate.alpha", Msg: "want a significance level between 0 and 1 (0.01)"}
	case !(h.MinExcess > 0 && h.MinExcess <= 1e6):
		return &Error{Key: "rollouts.healthGate.minExcess", Msg: "want a number of events above 0, at most 1000000 (2)"}
	case !(h.MinNodeHours > 0 && h.MinNodeHours <= 1e6):
		return &Error{Key: "rollouts.healthGate.minNodeHours", Msg: "want node-hours above 0, at most 1000000 (1)"}
	}
	return nil
}
