package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// auditCmd groups the audit log commands; audit list calls audit.list.
func auditCmd(e *env) *cobra.Command {
	return apiGroup(e, "audit", "Read the audit log (who changed what, from where, and how it ended)", auditListCmd)
}

func auditListCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		since, until, out string
		req               apiv1.ListAuditRequest
		limit             int
	)
	cmd := &cobra.Command{
		Use:   "list [--since 1h] [--until T] [--actor token:ID] [--method PREFIX] [--object O] [--outcome ok] [--limit N]",
		Short: "List audit log entries, newest first (needs an admin token)",
		Long: `list calls audit.list and prints the entries newest first. --since and --until
take a duration before now (90m, 24h) or an RFC 3339 time; since is
inclusive, until exclusive. --actor, --object and --outcome match exactly
(an API caller is token:<token id>); --method matches the start of the
action ("joinTokens." for every join token call). --limit bounds the entries
printed (0: all that match); -o json prints the API's ListAuditResponse, with
nextCursor set when more entries match than were printed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if limit < 0 {
				return usageError{fmt.Errorf("--limit %d: want 0 (all) or more", limit)}
			}
			now := time.Now()
			var err error
			if req.Since, err = auditTime("--since", since, now); err != nil {
				return err
			}
			if req.Until, err = auditTime("--until", until, now); err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListAuditResponse, error) {
					entries, next, err := listPages(ctx, limit, 1000, c.AuditList,
						func(p *apiv1.Page) *apiv1.ListAuditRequest { req.Page = p; return &req },
						(*apiv1.ListAuditResponse).GetEntries)
					return &apiv1.ListAuditResponse{Entries: entries, NextCursor: next}, err
				},
				func(_ *client.Client, all *apiv1.ListAuditResponse) error {
					if err := tableOf(e.stdout, []string{"TIME", "ACTOR", "METHOD", "OBJECT", "OUTCOME", "SOURCE"}, all.Entries,
						func(a *apiv1.AuditEntry) []string {
							return []string{when(a.Time), a.Actor, a.Action, orDash(a.Resource), a.Outcome, orDash(a.SourceIp)}
						}); err != nil {
						return err
					}
					if all.NextCursor != "" {
						fmt.Fprintf(e.stderr, "showing the newest %d entries; more match (--limit 0 for all)\n", len(all.Entries))
					}
					return nil
				})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&since, "since", "", "only entries at or after this: a duration before now (1h) or an RFC 3339 time")
	fl.StringVar(&until, "until", "", "only entries before this: a duration before now or an RFC 3339 time")
	fl.StringVar(&req.Actor, "actor", "", "only this actor, such as token:<token id> or join-token:<id>")
	fl.StringVar(&req.ActionPrefix, "method", "", "only actions starting with this, such as joinTokens. or sites.create")
	fl.StringVar(&req.Resource, "object", "", "only this object (the id or name the call addressed)")
	fl.StringVar(&req.Outcome, "outcome", "", "only this outcome: ok, denied or an error code such as NOT_FOUND")
	fl.IntVar(&limit, "limit", 100, "print at most this many entries, the newest (0: all)")
	outputFlag(cmd, &out)
	return cmd
}

// auditTime parses a --since or --until value: a duration before now
// ("90m") or an RFC 3339 time; "" is no bound.
func auditTime(flag, v string, now time.Time) (*timestamppb.Timestamp, error) {
	if v == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return nil, usageError{fmt.Errorf("%s %s: a duration before now must not be negative", flag, v)}
		}
		return timestamppb.New(now.Add(-d)), nil
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(v))
	if err != nil {
		return nil, usageError{fmt.Errorf("%s %q: want a duration before now (1h, 30m) or an RFC 3339 time (2026-03-01T12:00:00Z)", flag, v)}
	}
	return timestamppb.New(t), nil
}
