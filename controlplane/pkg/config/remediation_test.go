package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestRemediationDefaults checks the documented defaults: NVIDIA's
// resolutions mapped as docs/remediation.md says, and the breaker and
// timings.
func TestRemediationDefaults(t *testing.T) {
	c, err := Load("", env(map[string]string{"HOME": t.TempDir()}), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	r := c.Remediation
	if r.Disabled || r.Interval.Duration != 2*time.Second || r.MaxAttempts != 3 || r.Breaker.Quarantines != 0 ||
		r.Breaker.Share != 10 || r.Breaker.MinNodes != 1 || r.Breaker.Window.Duration != 10*time.Minute || r.VerifySettle.Duration != 30*time.Second ||
		r.Repeat.Window.Duration != 24*time.Hour || r.Repeat.NodeActions != 3 ||
		r.Repeat.Spacing.Duration != 10*time.Minute || r.Repeat.ContactSupport != 5 ||
		r.Verify.Diag != "1" || r.Verify.DiagTimeout.Duration != 10*time.Minute {
		t.Fatalf("defaults = %+v", r)
	}
	action := func(finding, resolution string) string {
		for _, rule := range r.Policy {
			if rule.Matches(finding, resolution) {
				return rule.Action
			}
		}
		return ""
	}
	for _, tc := range []struct{ finding, resolution, want string }{
		{FindingXID, "IGNORE", ActionNone},
		{FindingXID, "RESTART_APP", ActionNone},
		{FindingXID, "RESET_GPU", ActionGPUReset},
		{FindingXID, "RESTART_BM", ActionReboot},
		{FindingXID, "ESCALATE", ActionEscalate},
		{FindingXID, "CONTACT_SUPPORT", ActionEscalate},
		{FindingRowRemapFailure, "RESET_GPU", ActionEscalate},
		{FindingUnresponsive, "", ActionPowerCycle},
		{FindingPoweredOff, "", ActionNone},
		{FindingGPULost, "RESTART_BM", ActionReboot},
		{FindingECCUncorrected, "RESET_GPU", ActionGPUReset},
		{FindingInfiniBand, "CHECK_MECHANICALS", ActionCordon},
		{FindingInfiniBand, "ESCALATE", ActionCordon},
	} {
		if got := action(tc.finding, tc.resolution); got != tc.want {
			t.Errorf("%s %s -> %q, want %q", tc.finding, tc.resolution, got, tc.want)
		}
	}
}

// TestRemediationPolicyRefused checks that a bad policy is refused at start
// with the key and the line at fault.
func TestRemediationPolicyRefused(t *testing.T) {
	for _, tc := range []struct{ name, file, key, line string }{
		{"unknown action", "remediation:\n  policy:\n  - {resolution: RESET_GPU, action: gpu.reset}\n  - {resolution: RESTART_BM, action: reboot-now}\n",
			"remediation.policy[1].action", "line 4"},
		{"missing action", "remediation:\n  policy:\n  - resolution: RESET_GPU\n", "remediation.policy[0].action", "line 3"},
		{"unknown finding", "remediation:\n  policy:\n  - {finding: gpu-on-fire, action: escalate}\n", "remediation.policy[0].finding", "line 3"},
		{"lower-case resolution", "remediation:\n  policy:\n  - {resolution: reset_gpu, action: gpu.reset}\n", "remediation.policy[0].resolution", "line 3"},
		{"unknown key", "remediation:\n  policy:\n  - {xid: 79, action: reboot}\n", "remediation.policy[0].xid", "line 3"},
		{"repeated match", "remediation:\n  policy:\n  - {resolution: RESET_GPU, action: gpu.reset}\n  - {resolution: RESET_GPU, action: reboot}\n",
			"remediation.policy[1]", "line 4"},
		{"rule after catch-all", "remediation:\n  policy:\n  - {action: escalate}\n  - {resolution: RESET_GPU, action: gpu.reset}\n",
			"remediation.policy[1]", "line 4"},
		{"bad window", "remediation:\n  breaker:\n    window: soon\n", "remediation.breaker.window", "line 3"},
		{"zero attempts", "remediation:\n  maxAttempts: -1\n", "remediation.maxAttempts", ""},
		{"settle past timeout", "remediation:\n  verifySettle: 1h\n", "remediation.verifySettle", ""},
		{"negative node actions", "remediation:\n  repeat:\n    nodeActions: -1\n", "remediation.repeat.nodeActions", ""},
		{"node actions past bound", "remediation:\n  repeat:\n    nodeActions: 1000\n", "remediation.repeat.nodeActions", ""},
		{"repeat window past bound", "remediation:\n  repeat:\n    window: 8760h\n", "remediation.repeat.window", ""},
		{"negative repeat window", "remediation:\n  repeat:\n    window: -1h\n", "remediation.repeat.window", ""},
		{"negative spacing", "remediation:\n  repeat:\n    spacing: -1m\n", "remediation.repeat.spacing", ""},
		{"spacing past window", "remediation:\n  repeat:\n    window: 1h\n    spacing: 2h\n", "remediation.repeat.spacing", ""},
		{"contact support past bound", "remediation:\n  repeat:\n    contactSupport: 101\n", "remediation.repeat.contactSupport", ""},
		{"diag level 4", "remediation:\n  verify:\n    diag: 4\n", "remediation.verify.diag", "want none, builtin, 1, 2 or 3"},
		{"diag word", "remediation:\n  verify:\n    diag: quick\n", "remediation.verify.diag", `"quick"`},
		{"diag timeout past bound", "remediation:\n  verify:\n    diagTimeout: 48h\n", "remediation.verify.diagTimeout", "at most 24h"},
		{"diag timeout negative", "remediation:\n  verify:\n    diagTimeout: -1m\n", "remediation.verify.diagTimeout", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, tc.file), env(map[string]string{"HOME": t.TempDir()}), Flags{})
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != tc.key || !strings.Contains(ce.Msg, tc.line) {
				t.Fatalf("err = %v, want a config error naming %q at %q", err, tc.key, tc.line)
			}
		})
	}
	// A diag level loads as a number or a word, with its own default deadline.
	for file, want := range map[string][2]any{
		"remediation:\n  verify:\n    diag: 3\n":                      {"3", 2 * time.Hour},
		"remediation:\n  verify:\n    diag: \"2\"\n":                  {"2", 30 * time.Minute},
		"remediation:\n  verify:\n    diag: none\n":                   {"none", 10 * time.Minute},
		"remediation:\n  verify: {diag: builtin, diagTimeout: 90s}\n": {"builtin", 90 * time.Second},
	} {
		c, err := Load(writeFile(t, file), env(map[string]string{"HOME": t.TempDir()}), Flags{})
		if err != nil {
			t.Fatalf("%q: %v", file, err)
		}
		if v := c.Remediation.Verify; v.Diag != want[0] || v.DiagTimeout.Duration != want[1] {
			t.Errorf("%q: verify = %+v, want %v", file, v, want)
		}
	}
	// A good policy loads with its lines kept.
	c, err := Load(writeFile(t, "remediation:\n  policy:\n  - {resolution: RESET_GPU, action: reboot}\n  - {action: escalate}\n"),
		env(map[string]string{"HOME": t.TempDir()}), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Remediation.Policy; len(p) != 2 || p[0].Action != ActionReboot || p[0].Line != 3 {
		t.Fatalf("policy = %+v", p)
	}
}

// TestRemediationBreakerShare: the breaker's keys load as a share ("10%" or
// a number), a minimum and the old absolute cap, which still loads; bad
// values are refused with their key; the limit is max(minNodes, share) under
// the cap.
func TestRemediationBreakerShare(t *testing.T) {
	load := func(yml string) (*Remediation, error) {
		var r Remediation
		if err := yaml.Unmarshal([]byte(yml), &r); err != nil {
			return nil, err
		}
		r.defaults()
		return &r, r.validate()
	}
	r, err := load("breaker: {quarantines: 5, window: 1h}\n")
	if err != nil || r.Breaker.Quarantines != 5 || r.Breaker.Share != 10 || r.Breaker.MinNodes != 1 {
		t.Fatalf("an old configuration: %+v, %v", r, err)
	}
	if got := r.Breaker.Limit(200); got != 5 {
		t.Errorf("limit of 200 GPU nodes under a cap of 5: %d", got)
	}
	r, err = load("breaker: {share: \"25%\", minNodes: 2}\n")
	if err != nil || r.Breaker.Share != 25 || r.Breaker.Window.Duration != 10*time.Minute {
		t.Fatalf("share 25%%: %+v, %v", r, err)
	}
	for gpus, want := range map[int]int{0: 2, 4: 2, 20: 5, 1000: 250} {
		if got := r.Breaker.Limit(gpus); got != want {
			t.Errorf("limit of %d GPU nodes at 25%%, minNodes 2: %d, want %d", gpus, got, want)
		}
	}
	if got := (RemediationBreaker{}).Limit(20); got != 2 {
		t.Errorf("default limit of a 20-node pool: %d, want 2", got)
	}
	for yml, key := range map[string]string{
		"breaker: {share: 0.0001%}\n":  "",
		"breaker: {share: 150}\n":      "remediation.breaker.share",
		"breaker: {share: -5}\n":       "remediation.breaker.share",
		"breaker: {minNodes: -1}\n":    "remediation.breaker.minNodes",
		"breaker: {quarantines: -1}\n": "remediation.breaker.quarantines",
	} {
		_, err := load(yml)
		if key == "" {
			if err != nil {
				t.Errorf("%q: %v", yml, err)
			}
			continue
		}
		var ce *Error
		if !errors.As(err, &ce) || ce.Key != key {
			t.Errorf("%q: %v, want an error on %s", yml, err, key)
		}
	}
	if _, err := load("breaker: {share: lots}\n"); err == nil || !strings.Contains(err.Error(), "share in per cent") {
		t.Errorf("share lots: %v", err)
	}
}
