package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/better-compute/better-compute/controlplane/store"
)

// IDRemediationBreaker is the check of the pools' remediation circuit
// breakers.
const IDRemediationBreaker = "remediation.breaker"

// RemediationBreaker fails while a pool's remediation circuit breaker is
// tripped (DESIGN.md, "GPU health and closed-loop remediation";
// docs/remediation.md, "The circuit breaker"): more nodes were found
// failing within the window than the configured breaker admits, so
// detection itself may have gone wrong, and new cases are cordoned and held
// until it closes after its window or an operator looks and resets it. The detail names
// each tripped pool and when it tripped; the hint the reset command. No
// tripped breaker is ok; breakers that cannot be read fail.
func RemediationBreaker(ctx context.Context, st interface {
	RemediationBreakers(context.Context) ([]*store.RemediationBreaker, error)
}) Result {
	bs, err := st.RemediationBreakers(ctx)
	if err != nil {
		return result(IDRemediationBreaker, Fail, "cannot read the remediation breakers: "+err.Error())
	}
	var tripped []string
	var first string
	for _, b := range bs {
		if b.TrippedAt != nil {
			if first == "" {
				first = b.PoolID
			}
			tripped = append(tripped, fmt.Sprintf("%s since %s", b.PoolID, b.TrippedAt.UTC().Format("2006-01-02T15:04:05Z")))
		}
	}
	if len(tripped) == 0 {
		return result(IDRemediationBreaker, OK, "no pool's remediation breaker is tripped")
	}
	reset := "better-compute remediation reset-breaker POOL"
	if len(tripped) == 1 {
		reset = "better-compute remediation reset-breaker " + first
	}
	return result(IDRemediationBreaker, Fail, fmt.Sprintf("the remediation breaker of %d pool(s) is tripped: more nodes "+
		"failed within the window than the breaker admits (remediation.breaker.share), and new cases are cordoned and held, "+
		"not acted on, until it closes by itself after its window; see the held cases with "+
		"better-compute remediation list --state held, check that the findings are real, then %s", len(tripped), reset),
		strings.Join(tripped, ", "))
}
