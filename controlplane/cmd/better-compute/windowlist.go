package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// windowList is what the newest-first list commands over a time window
// (audit list, events list) share: the --since, --until and --limit flags,
// their checks, the paging up to --limit, the answer -o json prints (the
// pages merged, next_cursor the cursor after the last item printed, as
// every list answer of the API names it) and the note that more match.
// Each command keeps its filters, its request and its table.
type windowList[Req any, Resp interface {
	proto.Message
	listPage
}, T any] struct {
	// Noun names the items in flag help and the note ("entries").
	Noun string
	// List is the generated client's method, as a method expression
	// ((*client.Client).AuditList).
	List func(*client.Client, context.Context, Req) (Resp, error)
	// Req is the request, with the command's filters; run sets its page
	// and window through Page, Since and Until (its fields; nil: no bound).
	Req          Req
	Page         **apiv1.Page
	Since, Until **timestamppb.Timestamp
	// Items picks a page's items.
	Items func(Resp) []T
	// Header and Row draw the table.
	Header []string
	Row    func(T) []string

	since, until, out string
	limit             int
}

// command is the list command: use, short and long as cobra's, with
// --since, --until, --limit and -o; the caller adds its filters' flags.
func (w *windowList[Req, Resp, T]) command(e *env, af *apiFlags, use, short, long string) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Long: long, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return w.run(cmd.Context(), e, af) }}
	fl := cmd.Flags()
	fl.StringVar(&w.since, "since", "", "only "+w.Noun+" at or after this: a duration before now (1h) or an RFC 3339 time")
	fl.StringVar(&w.until, "until", "", "only "+w.Noun+" before this: a duration before now or an RFC 3339 time")
	fl.IntVar(&w.limit, "limit", 100, "print at most this many "+w.Noun+", the newest (0: all)")
	outputFlag(cmd, &w.out)
	return cmd
}

// run checks -o and the window's flags (usage errors), reads up to
// --limit items in pages of 1,000 and prints them (runAPI): -o json the
// Answer, else the table and, when more match than were printed, a note
// on stderr.
func (w *windowList[Req, Resp, T]) run(ctx context.Context, e *env, af *apiFlags) error {
	if err := checkOutput(w.out); err != nil {
		return err
	}
	if w.limit < 0 {
		return usageError{fmt.Errorf("--limit %d: want 0 (all) or more", w.limit)}
	}
	now := time.Now()
	since, err := windowTime("--since", w.since, now)
	if err != nil {
		return err
	}
	until, err := windowTime("--until", w.until, now)
	if err != nil {
		return err
	}
	return runAPI(ctx, e, af, w.out,
		func(ctx context.Context, c *client.Client) (Resp, error) {
			// The answer is the pages merged (their items appended), with
			// the cursor after the last item read.
			var answer Resp
			answer = answer.ProtoReflect().New().Interface().(Resp)
			list := func(ctx context.Context, r Req) (Resp, error) {
				page, err := w.List(c, ctx, r)
				if err == nil {
					proto.Merge(answer, page)
				}
				return page, err
			}
			*w.Since, *w.Until = since, until
			_, next, err := listPages(ctx, w.limit, 1000, list,
				func(p *apiv1.Page) Req { *w.Page = p; return w.Req }, w.Items)
			m := answer.ProtoReflect()
			m.Set(m.Descriptor().Fields().ByName("next_cursor"), protoreflect.ValueOfString(next))
			return answer, err
		},
		func(_ *client.Client, all Resp) error {
			items := w.Items(all)
			if err := tableOf(e.stdout, w.Header, items, w.Row); err != nil {
				return err
			}
			if all.GetNextCursor() != "" {
				fmt.Fprintf(e.stderr, "showing the newest %d %s; more match (--limit 0 for all)\n", len(items), w.Noun)
			}
			return nil
		})
}

// windowTime parses a --since or --until value: a duration before now
// ("90m") or an RFC 3339 time; "" is no bound.
func windowTime(flag, v string, now time.Time) (*timestamppb.Timestamp, error) {
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
