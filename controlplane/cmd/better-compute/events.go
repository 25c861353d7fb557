package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// eventsCmd groups the event commands: events list calls events.list,
// events watch tails GET {basePath}/events/watch.
func eventsCmd(e *env) *cobra.Command {
	return apiGroup(e, "events", "Read the events of the fleet (docs/events.md): list the past, watch live", eventsListCmd, eventsWatchCmd)
}

func eventsListCmd(e *env, af *apiFlags) *cobra.Command {
	var req apiv1.ListEventsRequest
	w := &windowList[*apiv1.ListEventsRequest, *apiv1.ListEventsResponse, *apiv1.Event]{Noun: "events", Header: []string{"ID", "TIME", "TYPE", "SUBJECT", "DATA"},
		List: (*client.Client).EventsList, Items: (*apiv1.ListEventsResponse).GetEvents, Row: eventRow,
		Req: &req, Page: &req.Page, Since: &req.Since, Until: &req.Until}
	cmd := w.command(e, af, "list [--type PREFIX] [--subject ID] [--since 1h] [--until T] [--limit N]",
		"List events, newest first (needs a viewer token)",
		`list calls events.list and prints the events newest first. --type keeps the
types that begin with it ("node." is read as com.better-compute.node.);
--subject keeps the events about one node, command or token id. --since and
--until take a duration before now (90m, 24h) or an RFC 3339 time; since is
inclusive, until exclusive. --limit bounds the events printed (0: all that
match); -o json prints the API's ListEventsResponse, each event with its
CloudEvents envelope, with nextCursor set when more events match than were
printed.`)
	fl := cmd.Flags()
	fl.StringVar(&req.TypePrefix, "type", "", "only types starting with this, such as node. or com.better-compute.gpu.")
	fl.StringVar(&req.Subject, "subject", "", "only events about this object (a node, command or token id)")
	return cmd
}

// eventRow is an event's row of the events list table.
func eventRow(ev *apiv1.Event) []string {
	return []string{ev.Id, when(ev.Time), shortType(ev.Type), orDash(ev.Subject), eventSummary(ev.CloudEvent)}
}

func eventsWatchCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		types []string
		after string
		out   string
	)
	cmd := &cobra.Command{
		Use:   "watch [--type PREFIX]... [--after ID]",
		Short: "Print events as they happen, until interrupted (needs a viewer token)",
		Long: `watch follows GET {basePath}/events/watch (Server-Sent Events) and prints each
event as it arrives: from now on, or after event id --after (an id events
list printed). --type keeps the types that begin with it (repeat it, or give
several separated by commas). When the connection drops, watch reconnects
and resumes after the last event it printed, so nothing is lost or printed
twice; if the events after that id were pruned by retention the server says
so (GONE) and watch ends with status 1; so it does, with one line saying
so, when its token is revoked or expires. -o json prints one JSON object per
line, each the shape of an event of events list -o json.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			p := client.WatchParams{}
			for _, t := range types {
				for _, part := range strings.Split(t, ",") {
					if part = strings.TrimSpace(part); part == "" {
						return usageError{fmt.Errorf("--type %q: want a type prefix such as node.", t)}
					}
					p.Types = append(p.Types, part)
				}
			}
			if after != "" {
				n, err := strconv.ParseInt(after, 10, 64)
				if err != nil || n < 0 {
					return usageError{fmt.Errorf("--after %q: want an event id (a number events list printed)", after)}
				}
				p.After, p.Resume = n, true
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			p.OnReconnect = func(err error, after int64) {
				fmt.Fprintf(e.stderr, "events watch: connection lost (%v); resuming after event %d\n", err, after)
			}
			ctx := cmd.Context()
			if out != "json" {
				fmt.Fprintf(e.stderr, "watching events (Ctrl-C to stop)\n")
			}
			err = c.Watch(ctx, p, func(ev *client.WatchEvent) error {
				return printWatched(e, out, ev)
			})
			if err == nil {
				return ctx.Err()
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&types, "type", nil, "only types starting with this, such as node. (repeatable)")
	fl.StringVar(&after, "after", "", "start after this event id instead of at the newest event")
	outputFlag(cmd, &out)
	return cmd
}

// printWatched prints one streamed event: a line of the API's Event JSON
// (-o json), or id, time, type, subject and a summary of its data.
func printWatched(e *env, out string, ev *client.WatchEvent) error {
	var env struct {
		Subject string    `json:"subject"`
		Time    time.Time `json:"time"`
	}
	_ = json.Unmarshal(ev.Data, &env)
	ce := &structpb.Struct{}
	if protojson.Unmarshal(ev.Data, ce) != nil {
		ce = nil
	}
	m := &apiv1.Event{Id: strconv.FormatInt(ev.ID, 10), Type: ev.Type, Subject: env.Subject, CloudEvent: ce}
	if !env.Time.IsZero() {
		m.Time = timestamppb.New(env.Time)
	}
	if out == "json" {
		b, err := protojson.Marshal(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n", b)
		return err
	}
	_, err := fmt.Fprintf(e.stdout, "%s  %s  %s  %s  %s\n", m.Id, when(m.Time), shortType(m.Type), orDash(m.Subject), eventSummary(ce))
	return err
}

// shortType is an event type without the common prefix.
func shortType(t string) string { return strings.TrimPrefix(t, "com.better-compute.") }

// eventSummary is an envelope's data as compact JSON, cut to 120
// characters for a table.
func eventSummary(ce *structpb.Struct) string {
	d := ce.GetFields()["data"]
	if d == nil {
		return "-"
	}
	b, err := protojson.Marshal(d)
	if err != nil {
		return "-"
	}
	var compact json.RawMessage = b
	if c, err := json.Marshal(compact); err == nil {
		b = c
	}
	if s := string(b); len(s) > 120 {
		return s[:117] + "..."
	}
	return string(b)
}
