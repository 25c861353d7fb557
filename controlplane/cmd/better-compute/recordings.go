package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// recordingsCmd groups the commands on recorded shells; they call
// recordings.* (docs/tunnels.md, "Recorded shells").
func recordingsCmd(e *env) *cobra.Command {
	return apiGroup(e, "recordings", "List and play back the recorded shell sessions",
		recordingsListCmd, recordingsPlayCmd)
}

var recordingHeader = []string{"ID", "NODE", "BY", "ROOT", "STARTED", "ENDED", "BYTES", "STATE", "REASON"}

func recordingRow(r *apiv1.Recording) []string {
	return []string{r.GetId(), r.GetNodeId(), r.GetCreatedBy(), strconv.FormatBool(r.GetAsRoot()), when(r.GetStartTime()),
		when(r.GetEndTime()), strconv.FormatInt(r.GetBytes(), 10), r.GetState(), r.GetReason()}
}

func recordingsListCmd(e *env, af *apiFlags) *cobra.Command {
	var node, out string
	cmd := &cobra.Command{
		Use:   "list [--node N]",
		Short: "List recorded shell sessions, newest first (needs a viewer token)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListRecordingsResponse, error) {
					rs, err := listAll(ctx, c.RecordingsList,
						func(p *apiv1.Page) *apiv1.ListRecordingsRequest {
							return &apiv1.ListRecordingsRequest{Page: p, Node: node}
						},
						(*apiv1.ListRecordingsResponse).GetRecordings)
					return &apiv1.ListRecordingsResponse{Recordings: rs}, err
				},
				func(_ *client.Client, r *apiv1.ListRecordingsResponse) error {
					if len(r.Recordings) == 0 {
						fmt.Fprintln(e.stderr, "no recordings")
						return nil
					}
					return tableOf(e.stdout, recordingHeader, r.Recordings, recordingRow)
				})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "only the shells of this node (id)")
	outputFlag(cmd, &out)
	return cmd
}

func recordingsPlayCmd(e *env, af *apiFlags) *cobra.Command {
	var speed float64
	var events bool
	cmd := &cobra.Command{
		Use:   "play ID [--speed N] [--events]",
		Short: "Play a recorded shell back in the terminal (needs a viewer token)",
		Long: `play writes what the shell printed to the terminal, in order and with its
timing: at real speed by default, N times as fast with --speed N, all at once
with --speed 0. The bytes are the terminal's as they were (a full-screen
program draws again). --events prints every event instead, one line each, in
the form of an asciicast v2 event: [seconds, "i" (typed) | "o" (printed) |
"r" (window, "COLSxROWS"), data].`,
		// The terminal's bytes pass as they are (escape.go).
		Annotations: map[string]string{annotationRawOutput: "true"},
		Args:        cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if speed < 0 || math.IsNaN(speed) || math.IsInf(speed, 0) {
				return usageError{fmt.Errorf("--speed %v: want 0 (at once) or a positive factor (1: real speed)", speed)}
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			return playRecording(cmd.Context(), c, args[0], speed, events, e.stdout)
		},
	}
	cmd.Flags().Float64Var(&speed, "speed", 1, "how many times as fast as it happened; 0 prints at once")
	cmd.Flags().BoolVar(&events, "events", false, "print every event (typed, printed, window sizes) as a line instead")
	return cmd
}

// playRecording reads recording id page by page (recordings.get) and
// writes it to out: the output events with their timing divided by speed
// (0: no waits), or with events every event as an asciicast v2 line.
func playRecording(ctx context.Context, c *client.Client, id string, speed float64, events bool, out io.Writer) error {
	var last time.Duration
	cursor := ""
	for {
		r, err := c.RecordingsGet(ctx, &apiv1.GetRecordingRequest{Id: id, Cursor: cursor})
		if err != nil {
			return err
		}
		for _, ev := range r.GetEvents() {
			at := ev.GetTime().AsDuration()
			if events {
				if err := writeCastEvent(out, at, ev); err != nil {
					return err
				}
				continue
			}
			if ev.GetOutput() == nil {
				continue
			}
			if wait := at - last; speed > 0 && wait > 0 {
				t := time.NewTimer(time.Duration(float64(wait) / speed))
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
			}
			last = at
			if _, err := out.Write(ev.GetOutput()); err != nil {
				return err
			}
		}
		if cursor = r.GetNextCursor(); cursor == "" {
			return nil
		}
	}
}

// writeCastEvent writes ev as an asciicast v2 event line.
func writeCastEvent(out io.Writer, at time.Duration, ev *apiv1.RecordingEvent) error {
	var code, data string
	switch {
	case ev.GetInput() != nil:
		code, data = "i", string(ev.GetInput())
	case ev.GetOutput() != nil:
		code, data = "o", string(ev.GetOutput())
	case ev.GetResize() != nil:
		code, data = "r", fmt.Sprintf("%dx%d", ev.GetResize().GetCols(), ev.GetResize().GetRows())
	default:
		return nil
	}
	b, err := json.Marshal([]any{json.Number(strconv.FormatFloat(at.Seconds(), 'f', 6, 64)), code, data})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}
