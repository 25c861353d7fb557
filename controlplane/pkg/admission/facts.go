package admission

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/better-compute/better-compute/controlplane/store"
)

// validateFacts checks the facts a machine sends against their limits: a
// hostname is required; every string is valid UTF-8 without control
// characters and within its length; no label is in the reservations'
// namespace (store.ReservationLabelPrefix).
func validateFacts(f *Facts) error {
	if f.Hostname == "" {
		return fmt.Errorf("hostname is required")
	}
	for _, v := range []struct {
		name  string
		value string
		max   int
	}{
		{"hostname", f.Hostname, MaxHostnameLen},
		{"machine id", f.MachineID, MaxFactLen},
		{"os", f.OS, MaxFactLen},
		{"arch", f.Arch, MaxFactLen},
		{"bcd version", f.BCDVersion, MaxFactLen},
		{"boot id", f.BootID, MaxFactLen},
	} {
		if err := checkText(v.name, v.value, v.max); err != nil {
			return err
		}
	}
	if len(f.Labels) > MaxLabels {
		return fmt.Errorf("%d labels, at most %d", len(f.Labels), MaxLabels)
	}
	for k, v := range f.Labels {
		if k == "" {
			return fmt.Errorf("label with an empty key")
		}
		if strings.HasPrefix(k, store.ReservationLabelPrefix) {
			// Set only by the placer while a reservation is active, so
			// that a selector on it names capacity truly reserved.
			return fmt.Errorf("label %q: the namespace %s is the control plane's (reservations), a node cannot set it", k, store.ReservationLabelPrefix)
		}
		if err := checkText("label key", k, MaxLabelKeyLen); err != nil {
			return err
		}
		if err := checkText("label "+k, v, MaxLabelValueLen); err != nil {
			return err
		}
	}
	return nil
}

// checkText checks one string of the facts.
func checkText(name, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%s is %d bytes, at most %d", name, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", name)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s holds a control character", name)
		}
	}
	return nil
}
