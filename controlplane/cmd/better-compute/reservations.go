package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// reservationsCmd groups the reservation commands; they call
// reservations.* (docs/reservations.md).
func reservationsCmd(e *env) *cobra.Command {
	return apiGroup(e, "reservations", "Hold GPU capacity of a pool for a window (the placer places it)",
		reservationsCreateCmd, reservationsListCmd, reservationsGetCmd, reservationsCancelCmd, reservationsExtendCmd)
}

// capacityCmd is better-compute capacity: capacity.summary.
func capacityCmd(e *env) *cobra.Command {
	af := &apiFlags{}
	var pool, at, from, to, out string
	c := &cobra.Command{
		Use:   "capacity [--pool P] [--at T | --from T --to T]",
		Short: "Count a pool's GPUs by model: free, reserved, unavailable (needs a viewer token)",
		Long: `capacity calls capacity.summary: the GPUs of --pool (every pool without it) by
model, at --at (default now) or over --from to --to, where a GPU counts as
reserved when a reservation holds it for part of the window, unavailable when
it is not reserved and its node is not ready, cordoned or out of service, or
it is unhealthy itself, and free otherwise. Times are RFC 3339 or a duration
from now (2h, +30m).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			now := time.Now()
			req := &apiv1.CapacitySummaryRequest{Pool: pool}
			var err error
			if req.At, err = futureTime("--at", at, now); err != nil {
				return err
			}
			if req.From, err = futureTime("--from", from, now); err != nil {
				return err
			}
			if req.To, err = futureTime("--to", to, now); err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.CapacitySummaryResponse, error) {
					return c.CapacitySummary(ctx, req)
				},
				func(_ *client.Client, r *apiv1.CapacitySummaryResponse) error {
					if len(r.Models) == 0 {
						fmt.Fprintln(e.stderr, "no GPUs")
						return nil
					}
					return tableOf(e.stdout, []string{"MODEL", "TOTAL", "FREE", "RESERVED", "UNAVAILABLE"}, r.Models,
						func(m *apiv1.CapacityModel) []string {
							return []string{m.Model, itoa(m.Total), itoa(m.Free), itoa(m.Reserved), itoa(m.Unavailable)}
						})
				})
		},
	}
	af.add(c)
	c.Flags().StringVar(&pool, "pool", "", "the pool (id or name); every pool without it")
	c.Flags().StringVar(&at, "at", "", "the time to count at (RFC 3339, or a duration from now); default now")
	c.Flags().StringVar(&from, "from", "", "the window's start, with --to")
	c.Flags().StringVar(&to, "to", "", "the window's end, with --from")
	outputFlag(c, &out)
	return c
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// futureTime parses a time flag: an RFC 3339 time, or a duration from now
// ("2h", "+30m"); "" is unset.
func futureTime(flag, v string, now time.Time) (*timestamppb.Timestamp, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(v, "+")); err == nil {
		if d < 0 {
			return nil, usageError{fmt.Errorf("%s %s: a duration from now must not be negative", flag, v)}
		}
		return timestamppb.New(now.Add(d)), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, usageError{fmt.Errorf("%s %q: want an RFC 3339 time (2026-03-01T12:00:00Z) or a duration from now (2h, +30m)", flag, v)}
	}
	return timestamppb.New(t), nil
}

// memoryMiB parses --min-gpu-memory: a number of MiB, or with a unit
// (MiB, GiB, TiB; MB, GB, TB are read as the binary units NVML reports).
func memoryMiB(v string) (int64, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, nil
	}
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 20}, {"TB", 1 << 20}, {"GiB", 1 << 10}, {"GB", 1 << 10}, {"MiB", 1}, {"MB", 1}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, usageError{fmt.Errorf("--min-gpu-memory %q: want a size such as 80GiB or 40960 (MiB)", v)}
	}
	return n * mult, nil
}

// labelFlags parses repeated key=value flags.
func labelFlags(flag string, vs []string) (map[string]string, error) {
	if len(vs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, s := range vs {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("%s %q: want key=value", flag, s)}
		}
		out[k] = v
	}
	return out, nil
}

// reservationWant is what a reservation asks for, for tables.
func reservationWant(r *apiv1.Reservation) string {
	w := fmt.Sprintf("%d GPU", r.Gpus)
	if r.Nodes > 0 {
		w = fmt.Sprintf("%d node", r.Nodes)
	}
	if r.GpuModel != "" {
		w += " " + r.GpuModel
	}
	return w
}

func reservationRow(r *apiv1.Reservation) []string {
	return []string{r.Id, r.State, reservationWant(r), when(r.Start), when(r.End), r.Owner, orDash(strings.Join(r.NodeIds, ",")), orDash(oneLine(r.Reason))}
}

var reservationHeader = []string{"ID", "STATE", "WANTS", "START", "END", "OWNER", "NODES", "REASON"}

// printReservation draws one reservation for people.
func printReservation(e *env, r *apiv1.Reservation) error {
	if err := table(e.stdout, reservationHeader, [][]string{reservationRow(r)}); err != nil {
		return err
	}
	for _, s := range r.Slots {
		fmt.Fprintf(e.stdout, "  %s GPU %d %s [%s, %s)\n", s.NodeId, s.Gpu, orDash(s.GpuUuid), when(s.Start), when(s.End))
	}
	return nil
}

func reservationsCreateCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		pool, model, mem, start, end, duration, owner, note, out string
		gpus, nodes                                              int32
		labels                                                   []string
	)
	cmd := &cobra.Command{
		Use:   "create --pool P (--gpus N | --nodes K) (--end T | --duration D) --owner O [flags]",
		Short: "Hold GPUs or whole nodes of a pool for a window (needs an operator token)",
		Long: `create calls reservations.create: the reservation is pending at once, and the
placer (the scheduler role's capacity.placer) places it within about a second,
or fails it with a reason; reservations get ID shows which. N GPUs go on one
node (the one with the fewest free GPUs that still fits), or as whole nodes
when no node has N free and N is a multiple of a node's GPU count; --nodes K
takes K whole nodes. While active, its nodes carry the labels
bc.reservation/id and bc.reservation/owner (docs/reservations.md). Times are
RFC 3339 or a duration from now (2h, +30m); --start defaults to now.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			now := time.Now()
			req := &apiv1.CreateReservationRequest{Pool: pool, Gpus: gpus, Nodes: nodes, GpuModel: model, Owner: owner, Note: note}
			var err error
			switch {
			case pool == "":
				return usageError{errors.New("--pool is required")}
			case owner == "":
				return usageError{errors.New("--owner is required: who the capacity is for")}
			case (gpus > 0) == (nodes > 0):
				return usageError{errors.New("give --gpus N or --nodes K")}
			case (end == "") == (duration == ""):
				return usageError{errors.New("give --end T or --duration D")}
			}
			if req.MinGpuMemoryMib, err = memoryMiB(mem); err != nil {
				return err
			}
			if req.Labels, err = labelFlags("--label", labels); err != nil {
				return err
			}
			if req.Start, err = futureTime("--start", start, now); err != nil {
				return err
			}
			if end != "" {
				if req.End, err = futureTime("--end", end, now); err != nil {
					return err
				}
			} else {
				d, err := time.ParseDuration(duration)
				if err != nil || d <= 0 {
					return usageError{fmt.Errorf("--duration %q: want a positive duration (4h, 90m)", duration)}
				}
				from := now
				if req.Start != nil {
					from = req.Start.AsTime()
				}
				req.End = timestamppb.New(from.Add(d))
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Reservation, error) {
					return c.ReservationsCreate(ctx, req)
				},
				func(_ *client.Client, r *apiv1.Reservation) error {
					fmt.Fprintf(e.stdout, "reservation %s is %s; see where it goes with: better-compute reservations get %s\n", r.Id, r.State, r.Id)
					return nil
				})
		},
	}
	f := cmd.Flags()
	f.StringVar(&pool, "pool", "", "the pool (id or name)")
	f.Int32Var(&gpus, "gpus", 0, "how many GPUs")
	f.Int32Var(&nodes, "nodes", 0, "how many whole nodes")
	f.StringVar(&model, "gpu-model", "", `GPU model: a part of its product name ("H100")`)
	f.StringVar(&mem, "min-gpu-memory", "", "least memory of each GPU (80GiB, or MiB)")
	f.StringArrayVar(&labels, "label", nil, "only nodes with this label key=value (repeatable)")
	f.StringVar(&start, "start", "", "the window's start (RFC 3339 or a duration from now); default now")
	f.StringVar(&end, "end", "", "the window's end (RFC 3339 or a duration from now)")
	f.StringVar(&duration, "duration", "", "the window's length, from --start")
	f.StringVar(&owner, "owner", "", "who the capacity is for (a team, a person, a job)")
	f.StringVar(&note, "note", "", "free text")
	outputFlag(cmd, &out)
	return cmd
}

func reservationsListCmd(e *env, af *apiFlags) *cobra.Command {
	var pool, state, owner, out string
	cmd := &cobra.Command{
		Use:   "list [--pool P] [--state S] [--owner O]",
		Short: "List reservations (needs a viewer token)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListReservationsResponse, error) {
					rs, err := listAll(ctx, c.ReservationsList,
						func(p *apiv1.Page) *apiv1.ListReservationsRequest {
							return &apiv1.ListReservationsRequest{Page: p, Pool: pool, State: state, Owner: owner}
						},
						(*apiv1.ListReservationsResponse).GetReservations)
					return &apiv1.ListReservationsResponse{Reservations: rs}, err
				},
				func(_ *client.Client, r *apiv1.ListReservationsResponse) error {
					if len(r.Reservations) == 0 {
						fmt.Fprintln(e.stderr, "no reservations")
						return nil
					}
					return tableOf(e.stdout, reservationHeader, r.Reservations, reservationRow)
				})
		},
	}
	cmd.Flags().StringVar(&pool, "pool", "", "only this pool's (id or name)")
	cmd.Flags().StringVar(&state, "state", "", "only those in this state: pending, placed, active, ended, cancelled, failed")
	cmd.Flags().StringVar(&owner, "owner", "", "only this owner's")
	outputFlag(cmd, &out)
	return cmd
}

func reservationsGetCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show a reservation and the GPUs it holds (needs a viewer token)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Reservation, error) {
					return c.ReservationsGet(ctx, &apiv1.GetReservationRequest{Id: args[0]})
				},
				func(_ *client.Client, r *apiv1.Reservation) error { return printReservation(e, r) })
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

func reservationsCancelCmd(e *env, af *apiFlags) *cobra.Command {
	var reason, out string
	cmd := &cobra.Command{
		Use:   "cancel ID [--reason R]",
		Short: "Cancel a pending, placed or active reservation (needs an operator token)",
		Long: `cancel calls reservations.cancel: the reservation's GPUs are free from now
(a window not yet begun frees them whole), its labels leave its nodes, and
reservation.cancelled is sent.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Reservation, error) {
					return c.ReservationsCancel(ctx, &apiv1.CancelReservationRequest{Id: args[0], Reason: reason})
				},
				func(_ *client.Client, r *apiv1.Reservation) error {
					fmt.Fprintf(e.stdout, "reservation %s cancelled\n", r.Id)
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the event")
	outputFlag(cmd, &out)
	return cmd
}

func reservationsExtendCmd(e *env, af *apiFlags) *cobra.Command {
	var end, by, out string
	cmd := &cobra.Command{
		Use:   "extend ID (--end T | --by D)",
		Short: "Move a reservation's end later, with its GPUs (needs an operator token)",
		Long: `extend calls reservations.extend: the reservation keeps the same GPUs until the
new end, or the command fails (CONFLICT, exit 1) naming the reservation that
holds one of them in the added time.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if (end == "") == (by == "") {
				return usageError{errors.New("give --end T or --by D")}
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Reservation, error) {
					req := &apiv1.ExtendReservationRequest{Id: args[0]}
					if end != "" {
						t, err := futureTime("--end", end, time.Now())
						if err != nil {
							return nil, err
						}
						req.End = t
					} else {
						d, err := time.ParseDuration(by)
						if err != nil || d <= 0 {
							return nil, usageError{fmt.Errorf("--by %q: want a positive duration (1h, 30m)", by)}
						}
						cur, err := c.ReservationsGet(ctx, &apiv1.GetReservationRequest{Id: args[0]})
						if err != nil {
							return nil, err
						}
						req.End = timestamppb.New(cur.End.AsTime().Add(d))
					}
					return c.ReservationsExtend(ctx, req)
				},
				func(_ *client.Client, r *apiv1.Reservation) error {
					fmt.Fprintf(e.stdout, "reservation %s now ends at %s\n", r.Id, when(r.End))
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&end, "end", "", "the new end (RFC 3339 or a duration from now)")
	cmd.Flags().StringVar(&by, "by", "", "move the end later by this much")
	outputFlag(cmd, &out)
	return cmd
}
