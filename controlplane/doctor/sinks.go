package doctor

import (
	"context"
	"fmt"
	"strings"
)

// IDDeadLetters is the check of the sinks' dead-letter table.
const IDDeadLetters = "sinks.dead-letter"

// DeadLetters counts the events each sink gave up on (store
// DeadLetterCounts; docs/events.md, "Sinks"). None is ok; any warns, with
// the count per sink in the detail and the replay command in the hint: a
// dead letter is a delivery that did not happen until it is replayed, but
// the sink itself delivers the events after it, so nothing is stopped (a
// receiver that is down now shows in the sink's delivery lag, not here).
// A table that cannot be read fails.
func DeadLetters(ctx context.Context, st interface {
	DeadLetterCounts(context.Context) (map[string]int64, error)
}) Result {
	counts, err := st.DeadLetterCounts(ctx)
	if err != nil {
		return result(IDDeadLetters, Fail, "cannot count dead letters: "+err.Error())
	}
	var total int64
	parts := make([]string, 0, len(counts))
	for _, sink := range sortedKeys(counts) {
		total += counts[sink]
		parts = append(parts, fmt.Sprintf("%s: %d", sink, counts[sink]))
	}
	if total == 0 {
		return result(IDDeadLetters, OK, "no sink has given up on an event")
	}
	replay := "better-compute sinks replay --all --sink SINK"
	if len(counts) == 1 {
		replay = "better-compute sinks replay --all --sink " + sortedKeys(counts)[0]
	}
	return result(IDDeadLetters, Warn, fmt.Sprintf("%d event(s) a sink gave up on wait in the dead-letter table: see why with "+
		"better-compute sinks dead-letters, fix the receiver, then %s", total, replay), strings.Join(parts, ", "))
}
