package journal_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/journal"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func open(t *testing.T, path string, slack int) *journal.Journal {
	t.Helper()
	j, err := journal.Open(journal.Config{Path: path, CompactSlack: slack})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func lines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return bytes.Count(b, []byte("\n"))
}

func TestWriteAndReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), journal.File)
	j := open(t, path, 0)
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	must(t, j.Accept(journal.Record{ID: "cmd_1", Kind: "exec", BootID: "boot-a", AcceptedAt: at}))
	must(t, j.Started("cmd_1", 4242, 987654))
	must(t, j.Accept(journal.Record{ID: "cmd_2", Kind: "reboot", BootID: "boot-a", AcceptedAt: at}))
	res := &sessionv1.CommandResult{CommandId: "cmd_1", State: sessionv1.CommandState_COMMAND_STATE_FAILED, ExitCode: 3, Error: "exit status 3"}
	must(t, j.Finished("cmd_1", res))
	must(t, j.Delivered("cmd_1"))
	must(t, j.Accept(journal.Record{ID: "cmd_3", Kind: "upgrade", BootID: "boot-a", AcceptedAt: at}))
	must(t, j.HandedOver("cmd_3"))
	must(t, j.Started("cmd_unknown", 1, 1)) // about no record: changes nothing
	must(t, j.Close())
	if err := j.Accept(journal.Record{ID: "late"}); err != journal.ErrClosed {
		t.Fatalf("Accept after Close = %v, want ErrClosed", err)
	}

	got := open(t, path, 0).Records()
	if len(got) != 3 {
		t.Fatalf("records after reopen = %+v", got)
	}
	r := got[0]
	if r.ID != "cmd_1" || r.Kind != "exec" || r.BootID != "boot-a" || !r.AcceptedAt.Equal(at) || r.PGID != 4242 ||
		r.StartTicks != 987654 || !r.Delivered || r.Result.GetExitCode() != 3 || r.Result.GetError() != "exit status 3" {
		t.Fatalf("cmd_1 after reopen = %+v (result %v)", r, r.Result)
	}
	if got[1].ID != "cmd_2" || got[1].Result != nil || got[1].PGID != 0 || got[1].Delivered {
		t.Fatalf("cmd_2 after reopen = %+v", got[1])
	}
	if got[2].ID != "cmd_3" || !got[2].HandedOver {
		t.Fatalf("cmd_3 after reopen = %+v", got[2])
	}
	// Open compacted the file: one line per record.
	if n := lines(t, path); n != 3 {
		t.Fatalf("journal holds %d lines after reopen, want 3", n)
	}
}

func TestForgetAndCompaction(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), journal.File)
	j := open(t, path, 4)
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		must(t, j.Accept(journal.Record{ID: id, Kind: "exec"}))
		must(t, j.Finished(id, &sessionv1.CommandResult{CommandId: id, State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}))
		must(t, j.Delivered(id))
		if id != "f" {
			must(t, j.Forget(id))
		}
	}
	// 24 changes for one live record: compaction kept the file short.
	if n := lines(t, path); n > 2*1+4 {
		t.Fatalf("journal holds %d lines for 1 record, want at most 6", n)
	}
	// Records accepted again take their new place in the order.
	must(t, j.Accept(journal.Record{ID: "g"}))
	must(t, j.Accept(journal.Record{ID: "f", Kind: "exec"}))
	check := func(rs []journal.Record) {
		t.Helper()
		if len(rs) != 2 || rs[0].ID != "g" || rs[1].ID != "f" || rs[1].Result != nil {
			t.Fatalf("records = %+v", rs)
		}
	}
	check(j.Records())
	must(t, j.Close())
	check(open(t, path, 4).Records())
}

func TestTornLastRecord(t *testing.T) {
	t.Parallel()
	for name, tail := range map[string]string{
		"no newline":   `0badc0de {"op":"record","id":"torn"`,
		"bad checksum": "00000000 {\"op\":\"record\",\"id\":\"torn\"}\n",
		"not json":     "1234\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), journal.File)
			j := open(t, path, 0)
			must(t, j.Accept(journal.Record{ID: "cmd_1", Kind: "exec"}))
			must(t, j.Started("cmd_1", 10, 20))
			must(t, j.Close())
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			must(t, err)
			_, err = f.WriteString(tail)
			must(t, err)
			must(t, f.Close())

			j = open(t, path, 0)
			rs := j.Records()
			if len(rs) != 1 || rs[0].ID != "cmd_1" || rs[0].PGID != 10 {
				t.Fatalf("records after a torn tail = %+v", rs)
			}
			// The torn tail is gone and later appends follow good lines.
			must(t, j.Finished("cmd_1", &sessionv1.CommandResult{CommandId: "cmd_1", State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}))
			must(t, j.Close())
			b, err := os.ReadFile(path)
			must(t, err)
			if bytes.Contains(b, []byte("torn")) || bytes.Contains(b, []byte("1234\n")) {
				t.Fatalf("journal still holds the torn line:\n%s", b)
			}
			rs = open(t, path, 0).Records()
			if len(rs) != 1 || rs[0].Result.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
				t.Fatalf("records after the append = %+v", rs)
			}
		})
	}
}

func TestOpenNeedsAPath(t *testing.T) {
	t.Parallel()
	if _, err := journal.Open(journal.Config{}); err == nil {
		t.Fatal("Open without a path succeeded")
	}
}

// TestAcceptRefusedWithoutReserve: with less than Config.Reserve free on
// the journal's filesystem, Accept fails with ErrDiskFull and writes
// nothing, while the records already accepted can still change (issue 29).
func TestAcceptRefusedWithoutReserve(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), journal.File)
	j := open(t, path, 0)
	must(t, j.Accept(journal.Record{ID: "cmd_1", Kind: "exec"}))
	must(t, j.Close())
	j, err := journal.Open(journal.Config{Path: path, Reserve: 1 << 62}) // more than any disk has free
	must(t, err)
	t.Cleanup(func() { j.Close() })
	before := lines(t, path)
	if err := j.Accept(journal.Record{ID: "cmd_2", Kind: "exec"}); !errors.Is(err, journal.ErrDiskFull) {
		t.Fatalf("Accept without the reserve free: %v, want ErrDiskFull", err)
	}
	if n := lines(t, path); n != before {
		t.Errorf("a refused Accept wrote %d lines", n-before)
	}
	must(t, j.Finished("cmd_1", &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}))
	if rs := j.Records(); len(rs) != 1 || rs[0].ID != "cmd_1" || rs[0].Result == nil {
		t.Errorf("records %+v, want cmd_1 with its result", rs)
	}
}
