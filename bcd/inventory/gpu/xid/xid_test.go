package xid_test

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
)

// Every code in the CSV maps to a resolution: NVIDIA's immediate word, or
// ESCALATE for a blank or WORKFLOW_* one. The file is read here on its own
// (line by line, not through Parse) so that a row Parse skipped would show.
func TestEveryCodeClassifies(t *testing.T) {
	t.Parallel()
	c, err := xid.Load()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("xid-catalog.csv")
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "code,") {
			continue
		}
		f := strings.Split(line, ",")
		code, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		rows++
		e, ok := c.Lookup(uint32(code))
		if !ok {
			t.Errorf("XID %d: not in the catalogue", code)
			continue
		}
		want := f[2]
		switch {
		case code == uint64(xid.RecoveryActionChanged):
			want = xid.Ignore // informational: the recovery action it announces is read from NVML
		case want == "" || strings.HasPrefix(want, "WORKFLOW_"):
			want = xid.Escalate
		}
		if e.Resolution != want || e.Resolution == "" || e.Mnemonic != f[1] {
			t.Errorf("XID %d: %+v, want resolution %s and mnemonic %s", code, e, want, f[1])
		}
	}
	if rows < 150 || len(c.Entries()) != rows {
		t.Errorf("%d rows in the file, %d entries parsed", rows, len(c.Entries()))
	}
}

// The codes issue 19 names: bcd's old hand-written table had them wrong or
// did not know them.
func TestNamedCodes(t *testing.T) {
	t.Parallel()
	c, err := xid.Load()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]string{
		63: xid.Ignore, 92: xid.Ignore, 94: xid.RestartApp, 13: xid.RestartApp,
		62: xid.ResetGPU, 95: xid.ResetGPU, 119: xid.ResetGPU, 120: xid.ResetGPU, 136: xid.ResetGPU, 140: xid.ResetGPU,
		143: xid.ResetGPU, 155: xid.ResetGPU, 156: xid.ResetGPU, 158: xid.ResetGPU,
		79: xid.RestartBM, 48: xid.Escalate, 74: xid.Escalate, 144: xid.Escalate, 162: xid.Escalate, 31: xid.RestartApp,
		154: xid.Ignore, // "Informational only regarding another Xid" (issue 32)
	}
	for code, res := range want {
		if got := c.Classify(code); got.Resolution != res {
			t.Errorf("XID %d: %s (%+v), want %s", code, got.Resolution, got, res)
		}
	}
	if e := c.Classify(79); e.Mnemonic != "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" {
		t.Errorf("XID 79 mnemonic %q", e.Mnemonic)
	}
	if e := c.Classify(100000); e.Resolution != xid.Escalate || e.Mnemonic != "" {
		t.Errorf("unknown XID: %+v, want ESCALATE without mnemonic", e)
	}
}

func TestParseRefusesBadFiles(t *testing.T) {
	t.Parallel()
	const head = "# comment\ncode,mnemonic,immediate_resolution,investigatory_resolution\n"
	for name, in := range map[string]string{
		"empty":        "",
		"no rows":      head,
		"bad header":   "code,name,a,b\n1,X,IGNORE,\n",
		"three fields": head + "1,X,IGNORE\n",
		"bad code":     head + "x1,X,IGNORE,\n",
		"negative":     head + "-1,X,IGNORE,\n",
		"duplicate":    head + "1,X,IGNORE,\n1,Y,IGNORE,\n",
		"no mnemonic":  head + "1,,IGNORE,\n",
		"two words":    head + "1,X,RESET GPU,\n",
		"bad quote":    head + "1,\"X,IGNORE,\n",
	} {
		if _, err := xid.Parse(strings.NewReader(in)); !errors.Is(err, xid.ErrBadCatalog) {
			t.Errorf("%s: Parse = %v, want ErrBadCatalog", name, err)
		}
	}
	c, err := xid.Parse(strings.NewReader(head + "7,SEVEN,,\r\n8,EIGHT,WORKFLOW_X,CONTACT_SUPPORT\r\n9,NINE,RESET_GPU,IGNORE (sympathetic)\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	for code, res := range map[uint32]string{7: xid.Escalate, 8: xid.Escalate, 9: xid.ResetGPU} {
		if e, _ := c.Lookup(code); e.Resolution != res {
			t.Errorf("XID %d: %+v, want %s", code, e, res)
		}
	}
}
