package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/reconcilers/sweeper"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Overdue work: the sweeper runs every second, so a command a little past
// its deadline is normal; one past it by QueueWarnAfter is not, and one past
// it by QueueFailAfter means nothing is sweeping.
const (
	QueueWarnAfter = 10 * time.Second
	QueueFailAfter = 5 * time.Minute
)

// liveStates are the non-terminal command states.
var liveStates = []string{store.CommandQueued, store.CommandDispatched, store.CommandAccepted, store.CommandRunning}

// Queue counts commands in a non-terminal state (queued, dispatched,
// accepted, running) whose deadline passed more than QueueWarnAfter before
// now (the database's clock): the CommandSweeper should have ended them
// expired. Any such command warns; one overdue by more than QueueFailAfter
// fails. It returns the overdue count for the sweeper check.
func Queue(ctx context.Context, st interface {
	CommandList(context.Context, *store.CommandListParams) ([]*store.Command, error)
}, now time.Time) (Result, int) {
	counts := map[string]int{}
	total := 0
	var oldest time.Duration
	for _, state := range liveStates {
		p := &store.CommandListParams{State: state, ListParams: store.ListParams{Limit: store.MaxListLimit}}
		for {
			page, err := st.CommandList(ctx, p)
			if err != nil {
				return result(IDQueue, Fail, "cannot list commands: "+err.Error()), 0
			}
			for _, c := range page {
				if late := now.Sub(c.DeadlineAt); late > QueueWarnAfter {
					counts[state]++
					total++
					oldest = max(oldest, late)
				}
			}
			if len(page) < store.MaxListLimit {
				break
			}
			p.Cursor = page[len(page)-1].ID
		}
	}
	if total == 0 {
		return result(IDQueue, OK, "no command is past its deadline"), 0
	}
	var parts []string
	for _, s := range liveStates {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
		}
	}
	detail := fmt.Sprintf("%s; the oldest is %s past its deadline", strings.Join(parts, ", "), oldest.Round(time.Second))
	if oldest > QueueFailAfter {
		return result(IDQueue, Fail, fmt.Sprintf("%d command(s) long past their deadline: the CommandSweeper is not ending them (see workers.sweeper)", total), detail), total
	}
	return result(IDQueue, Warn, fmt.Sprintf("%d command(s) past their deadline and not yet expired", total), detail), total
}

// Sweeper checks the CommandSweeper's singleton lease
// (singleton:command-sweeper): held by a process and not expired by the
// database's clock. A lease that is absent, released or expired while
// overdue commands wait fails; without overdue commands it warns, since
// nothing will end the next ones either.
func Sweeper(ctx context.Context, st interface {
	LeaseGet(context.Context, string) (*store.Lease, error)
}, overdue int, now time.Time) Result {
	l, err := st.LeaseGet(ctx, sweeper.LeaseName)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return result(IDSweeper, Fail, "cannot read the sweeper lease: "+err.Error())
	}
	if err == nil && l.Holder != "" && l.ExpiresAt.After(now) {
		return result(IDSweeper, OK, "the CommandSweeper runs", fmt.Sprintf("%s held by %s at epoch %d, renewed %s ago",
			sweeper.LeaseName, l.Holder, l.Epoch, now.Sub(l.RenewedAt).Round(time.Millisecond)))
	}
	var detail string
	switch {
	case err != nil:
		detail = sweeper.LeaseName + " was never taken"
	case l.Holder == "":
		detail = fmt.Sprintf("%s released at epoch %d", sweeper.LeaseName, l.Epoch)
	default:
		detail = fmt.Sprintf("%s of %s expired %s ago", sweeper.LeaseName, l.Holder, now.Sub(l.ExpiresAt).Round(time.Second))
	}
	if overdue > 0 {
		return result(IDSweeper, Fail, fmt.Sprintf("the CommandSweeper is stopped and %d command(s) are overdue: run a process with the controllers role", overdue), detail)
	}
	return result(IDSweeper, Warn, "no process runs the CommandSweeper: run a process with the controllers role", detail)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
