package main

import (
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// auditCmd groups the audit log commands; audit list calls audit.list.
func auditCmd(e *env) *cobra.Command {
	return apiGroup(e, "audit", "Read the audit log (who changed what, from where, and how it ended)", auditListCmd)
}

func auditListCmd(e *env, af *apiFlags) *cobra.Command {
	var req apiv1.ListAuditRequest
	w := &windowList[*apiv1.ListAuditRequest, *apiv1.ListAuditResponse, *apiv1.AuditEntry]{Noun: "entries", Header: []string{"TIME", "ACTOR", "METHOD", "OBJECT", "OUTCOME", "SOURCE"},
		List: (*client.Client).AuditList, Items: (*apiv1.ListAuditResponse).GetEntries, Row: auditRow,
		Req: &req, Page: &req.Page, Since: &req.Since, Until: &req.Until}
	cmd := w.command(e, af, "list [--since 1h] [--until T] [--actor token:ID] [--method PREFIX] [--object O] [--outcome ok] [--limit N]",
		"List audit log entries, newest first (needs an admin token)",
		`list calls audit.list and prints the entries newest first. --since and --until
take a duration before now (90m, 24h) or an RFC 3339 time; since is
inclusive, until exclusive. --actor, --object and --outcome match exactly
(an API caller is token:<token id>); --method matches the start of the
action ("joinTokens." for every join token call). --limit bounds the entries
printed (0: all that match); -o json prints the API's ListAuditResponse, with
nextCursor set when more entries match than were printed.`)
	fl := cmd.Flags()
	fl.StringVar(&req.Actor, "actor", "", "only this actor, such as token:<token id> or join-token:<id>")
	fl.StringVar(&req.ActionPrefix, "method", "", "only actions starting with this, such as joinTokens. or sites.create")
	fl.StringVar(&req.Resource, "object", "", "only this object (the id or name the call addressed)")
	fl.StringVar(&req.Outcome, "outcome", "", "only this outcome: ok, denied or an error code such as NOT_FOUND")
	return cmd
}

// auditRow is an audit entry's row of the table.
func auditRow(a *apiv1.AuditEntry) []string {
	return []string{when(a.Time), a.Actor, a.Action, orDash(a.Resource), a.Outcome, orDash(a.SourceIp)}
}
