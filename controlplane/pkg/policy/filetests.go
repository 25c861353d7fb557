package policy

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// DefaultTestTime is a test case's time when it gives none: Monday 5
// January 2026, 12:00 UTC.
var DefaultTestTime = time.Date(2026, time.January, 5, 12, 0, 0, 0, time.UTC)

// TestGrantID is the access request id of a test caller's grants
// (TestCaller.Granted), as decisions' reasons name it.
const TestGrantID = "acr_test"

// ErrTestsFailed is returned by Load when a test case of the file gets
// another decision than it expects.
var ErrTestsFailed = errors.New("policy tests failed")

// TestResult is the outcome of one test case.
type TestResult struct {
	// Name is the test case's name.
	Name string
	// Want is what it expects and Got what it got: Allow or Deny.
	Want, Got string
	// Reason is the decision's reason.
	Reason string
}

// Passed reports whether the case got what it expects.
func (r TestResult) Passed() bool { return r.Want == r.Got }

// AllPassed reports whether every result passed.
func AllPassed(results []TestResult) bool {
	for _, r := range results {
		if !r.Passed() {
			return false
		}
	}
	return true
}

// RunTests decides each of d's test cases with set, the caller's tenant
// being the set's, and returns their results in order.
func (d *Document) RunTests(set *Set) []TestResult {
	out := make([]TestResult, 0, len(d.Tests))
	for i := range d.Tests {
		t := &d.Tests[i]
		dec := set.Decide(t.input(set.Tenant()))
		got := Deny
		if dec.Allow {
			got = Allow
		}
		out = append(out, TestResult{Name: t.Name, Want: t.Expect, Got: got, Reason: dec.Reason})
	}
	return out
}

// input returns the call t describes, by a caller of tenant.
func (t *Test) input(tenant string) Input {
	in := Input{
		Principal: Principal{Token: t.Caller.Token, Tenant: tenant, Role: t.Caller.Role, Groups: t.Caller.Groups},
		Action:    t.Action,
		Resource:  t.Resource,
		Time:      DefaultTestTime,
		Fields:    t.Fields,
	}
	if t.SourceIP != "" {
		in.SourceIP, _ = parseAddr(t.SourceIP) // checked by Parse
	}
	if t.Time != "" {
		in.Time, _ = parseTime(t.Time) // checked by Parse
	}
	for _, name := range t.Caller.Granted {
		in.Grants = append(in.Grants, Grant{ID: TestGrantID, Policy: name, End: in.Time.Add(time.Hour)})
	}
	return in
}

func parseTime(s string) (time.Time, error) { return time.Parse(time.RFC3339, s) }

// Load parses src, compiles it for tenant and runs its tests: what
// "better-compute policy apply" does before the set replaces the tenant's.
// It returns the results of the tests whether they pass or not; when one
// fails, the error wraps ErrTestsFailed and lists the failures.
func Load(tenant string, src []byte, cat Catalog) (*Document, *Set, []TestResult, error) {
	doc, err := Parse(src)
	if err != nil {
		return nil, nil, nil, err
	}
	set, err := Compile(tenant, doc, cat)
	if err != nil {
		return doc, nil, nil, err
	}
	results := doc.RunTests(set)
	if AllPassed(results) {
		return doc, set, results, nil
	}
	var b strings.Builder
	for _, r := range results {
		if !r.Passed() {
			fmt.Fprintf(&b, "\n  test %q: want %s, got %s (%s)", r.Name, r.Want, r.Got, r.Reason)
		}
	}
	return doc, set, results, fmt.Errorf("%w:%s", ErrTestsFailed, b.String())
}
