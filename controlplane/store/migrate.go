package store

import (
	"context"
	"slices"
	"strings"
	"time"
)

// MigrationError is returned by Migrate and Check when the database holds
// applied migrations this build does not know: it was migrated by a newer
// build, and running this one against it could corrupt it.
type MigrationError struct {
	// Unknown lists the names of the applied migrations this build lacks.
	Unknown []string
}

func (e *MigrationError) Error() string {
	return "database was migrated by a newer build: unknown applied migrations " + strings.Join(e.Unknown, ", ") + "; run the build that applied them"
}

// Migrator applies and reports schema migrations.
type Migrator interface {
	// Migrate applies every pending migration under a lock (an advisory
	// lock on PostgreSQL, the write lock on SQLite), so concurrent callers all
	// succeed with one schema. It returns the names it applied, and a
	// *MigrationError naming applied migrations this build does not know,
	// or the names applied before a refused contract migration with a
	// *ContractRefusedError (issue 40).
	Migrate(ctx context.Context) ([]string, error)
	// MigrateTo is Migrate stopping after the migration named last (one
	// this build embeds; else an error), for staged upgrades and tests.
	// A refused contract migration is a *ContractRefusedError after the
	// names applied before it (issue 40).
	MigrateTo(ctx context.Context, last string) ([]string, error)
	// MigrationStatus reports applied and pending migration names, and a
	// *MigrationError when the database holds unknown ones.
	MigrationStatus(ctx context.Context) (*MigrationStatus, error)
}

// MigrationStatus is the schema's state against this build.
type MigrationStatus struct {
	Applied []string
	// Pending lists every migration this build embeds and the database
	// lacks, in order.
	Pending []string
	// PendingContract is the part of Pending marked `-- contract` (issue
	// 40, docs/upgrade-control-plane.md): a build runs on the schema before
	// its contract migrations, so they do not make it unready.
	PendingContract []string
}

// PendingExpand returns the pending migrations that are not contract ones:
// those a build needs before it serves.
func (s *MigrationStatus) PendingExpand() []string {
	var out []string
	for _, n := range s.Pending {
		if !slices.Contains(s.PendingContract, n) {
			out = append(out, n)
		}
	}
	return out
}

// ContractLiveWithin is how fresh a workers or gateways row's heartbeat
// must be for a contract migration to count its process as live.
const ContractLiveWithin = time.Minute

// ContractRefusedError is Migrate's error when a pending contract
// migration (first line `-- contract`) would drop a shape that a live
// process still needs: a processes row whose schema (the newest migration
// its build embeds) is older than Migration or empty, a live workers row
// with no processes row, or a live gateways row with no processes row of
// role gateway and the same version (a build from before the processes
// table). Migrate applies the migrations before Migration and stops there.
type ContractRefusedError struct {
	// Migration is the contract migration not applied.
	Migration string
	// Processes describe the processes that need the old shape, e.g.
	// "process p1 (version 1.2.0, schema 0018_rollout_watch)".
	Processes []string
}

func (e *ContractRefusedError) Error() string {
	return "contract migration " + e.Migration + " refused: live processes still run builds that need the old schema: " +
		strings.Join(e.Processes, "; ") + "; upgrade or stop them (docs/upgrade-control-plane.md), then migrate again"
}
