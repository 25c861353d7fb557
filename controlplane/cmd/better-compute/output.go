package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// outputFlag adds -o/--output (table or json) to cmd.
func outputFlag(cmd *cobra.Command, dst *string) {
	cmd.Flags().StringVarP(dst, "output", "o", "table", "output format: table or json")
}

// checkOutput validates an -o value.
func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return usageError{fmt.Errorf("--output %q: want table or json", o)}
	}
	return nil
}

// printJSON writes a protobuf message as indented protojson, with the
// field names and forms the API answers in (lowerCamelCase, RFC 3339
// timestamps, unpopulated fields left out): every -o json of an API command
// prints the API's own message this way (DESIGN.md, "Operator CLI").
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// printValue writes any value as indented JSON.
func printValue(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns for people, each cell escaped (escapeText):
// a value cannot break its row or column, or reorder what is shown.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = escapeText(c, false)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// tableOf writes a table of items, row making each one's columns.
func tableOf[T any](w io.Writer, header []string, items []T, row func(T) []string) error {
	rows := make([][]string, 0, len(items))
	for _, x := range items {
		rows = append(rows, row(x))
	}
	return table(w, header, rows)
}

// when formats a timestamp for tables ("-" when unset).
func when(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

// ago formats the age of a timestamp ("-" when unset).
func ago(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return time.Since(t.AsTime()).Round(time.Second).String() + " ago"
}

// commandOutput is a command's captured stdout and stderr as bytes, from
// whichever of the text and base64 fields the API set.
func commandOutput(c *apiv1.Command) (stdout, stderr []byte) {
	return outputBytes(c.GetStdout(), c.GetStdoutBase64()), outputBytes(c.GetStderr(), c.GetStderrBase64())
}

func outputBytes(text string, raw []byte) []byte {
	if len(raw) > 0 {
		return raw
	}
	return []byte(text)
}

// getCommand is commands.get of id; with includeOutput it follows the
// output's pages (at most 1 MiB each, next_output_cursor) and returns the
// command with all of its output, as text where each stream is valid UTF-8
// and in the _base64 field otherwise.
func getCommand(ctx context.Context, c *client.Client, id string, includeOutput bool) (*apiv1.Command, error) {
	resp, err := c.CommandsGet(ctx, &apiv1.GetCommandRequest{Id: id, IncludeOutput: includeOutput})
	if err != nil || resp.GetNextOutputCursor() == "" {
		return resp.GetCommand(), err
	}
	x := resp.GetCommand()
	stdout, stderr := commandOutput(x)
	for cursor := resp.GetNextOutputCursor(); cursor != ""; cursor = resp.GetNextOutputCursor() {
		if resp, err = c.CommandsGet(ctx, &apiv1.GetCommandRequest{Id: id, IncludeOutput: true, OutputCursor: cursor}); err != nil {
			return nil, err
		}
		o, e := commandOutput(resp.GetCommand())
		stdout, stderr = append(stdout, o...), append(stderr, e...)
	}
	x.Stdout, x.StdoutBase64 = textOrBytes(stdout)
	x.Stderr, x.StderrBase64 = textOrBytes(stderr)
	return x, nil
}

// textOrBytes is b as the API gives a stream: text when valid UTF-8.
func textOrBytes(b []byte) (string, []byte) {
	if utf8.Valid(b) {
		return string(b), nil
	}
	return "", b
}
