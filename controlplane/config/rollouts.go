package config

import "time"

// Rollouts configures the rollout reconciler of the controllers role (key
// rollouts; docs/rollouts.md).
type Rollouts struct {
	// Interval is how often each shard's active rollouts are stepped.
	// Defaults to 1 s; at most 1 min.
	Interval Duration `yaml:"interval"`
}

func (r *Rollouts) defaults() {
	if r.Interval.Duration == 0 {
		r.Interval.Duration = time.Second
	}
}

func (r *Rollouts) validate() error {
	if d := r.Interval.Duration; d < 10*time.Millisecond || d > time.Minute {
		return &Error{Key: "rollouts.interval", Msg: "want 10ms to 1m"}
	}
	return nil
}
