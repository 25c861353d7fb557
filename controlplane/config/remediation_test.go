package config

import (
	"errors"
	"strings"
	"testing"
	"time"
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
	if r.Disabled || r.Interval.Duration != 2*time.Second || r.MaxAttempts != 3 || r.Breaker.Quarantines != 5 ||
		r.Breaker.Window.Duration != time.Hour || r.VerifySettle.Duration != 30*time.Second ||
		r.Repeat.Window.Duration != 24*time.Hour || r.Repeat.NodeActions != 3 {
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, tc.file), env(map[string]string{"HOME": t.TempDir()}), Flags{})
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != tc.key || !strings.Contains(ce.Msg, tc.line) {
				t.Fatalf("err = %v, want a config error naming %q at %q", err, tc.key, tc.line)
			}
		})
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
