package helper

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzRequest feeds the helper's request reader and decoder (what a peer
// on the socket controls) arbitrary bytes: nothing panics, a line past
// MaxRequest is refused, an accepted request keeps every bound and decodes
// the same after a round trip, and no input makes a grant the helper did
// not issue (a root exec it accepts still needs one).
func FuzzRequest(f *testing.F) {
	for _, seed := range []string{
		`{"op":"ping"}`,
		`{"op":"exec.user","exec":{"argv":["id","-u"],"env":{"A":"b"},"dir":"/tmp","output_limit":1024}}`,
		`{"op":"exec","exec":{"argv":["id"],"command_id":"cmd_1","grant":"00"}}`,
		`{"op":"shell.user","shell":{"rows":24,"cols":80,"id":"tun_2"}}`,
		`{"op":"grant","grant":{"id":"cmd_1"}}`,
		`{"op":"shell","shell":{"rows":24,"cols":80,"id":"tun_1","grant":"x"}}`,
		`{"op":"exec","exec":{"argv":[""]}}`,
		`{"op":"exec","exec":{"argv":["x"],"env":{"":"1","A=B":"2"}}}`,
		`{"op":"exec","exec":{"argv":["x"],"output_limit":-1}}`,
		`{"op":"ping"} {"op":"exec"}`,
		`{"op":"kmsg.xid"}`,
		`{"op":"pins.apply","pins":{"statement":"e30=","signature":"e30="}}`,
		`{"op":"pins.apply","pins":{}}`,
		"not json",
		"",
	} {
		f.Add([]byte(seed + "\n"))
	}
	now := time.Unix(1_000_000, 0)
	f.Fuzz(func(t *testing.T, data []byte) {
		line, err := readLine(bufio.NewReaderSize(bytes.NewReader(data), 16), MaxRequest)
		if err != nil {
			if len(data) > MaxRequest+1 && !errors.Is(err, errTooLong) && bytes.IndexByte(data[:MaxRequest+1], '\n') < 0 {
				t.Fatalf("a line past MaxRequest read as %v", err)
			}
			return
		}
		if len(line) > MaxRequest || bytes.IndexByte(line, '\n') >= 0 {
			t.Fatalf("readLine returned %d bytes holding a newline or past the bound", len(line))
		}
		req, err := decodeRequest(line)
		if err != nil {
			return
		}
		switch req.Op {
		case OpExec, OpExecUser:
			e := req.Exec
			if e == nil || len(e.Argv) == 0 || len(e.Argv) > MaxArgs || len(e.Env) > MaxEnv || e.OutputLimit < 0 || e.OutputLimit > MaxOutputLimit {
				t.Fatalf("exec past its bounds accepted: %+v", e)
			}
			for k := range e.Env {
				if k == "" || strings.ContainsAny(k, "=\x00") {
					t.Fatalf("environment name %q accepted", k)
				}
			}
			if req.Op == OpExec {
				if checkID(e.CommandID) != nil {
					t.Fatalf("root exec with id %q accepted", e.CommandID)
				}
				g := newGrants(func() time.Time { return now })
				if g.use(e.CommandID, e.Grant) == nil {
					t.Fatalf("a request made its own grant: %+v", e)
				}
				tok, err := g.issue(e.CommandID)
				if err != nil {
					t.Fatal(err)
				}
				if g.use(e.CommandID+"x", tok) == nil {
					t.Fatal("a grant worked for another id")
				}
				tok, _ = g.issue(e.CommandID)
				if err := g.use(e.CommandID, tok); err != nil {
					t.Fatalf("a grant for %q refused: %v", e.CommandID, err)
				}
				if g.use(e.CommandID, tok) == nil {
					t.Fatal("a grant worked twice")
				}
			}
		case OpGrant:
			if req.Grant == nil || checkID(req.Grant.ID) != nil {
				t.Fatalf("grant accepted: %+v", req.Grant)
			}
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		req2, err := decodeRequest(again)
		if err != nil {
			t.Fatalf("round trip of an accepted request refused: %v\n%s", err, again)
		}
		if again2, _ := json.Marshal(req2); !bytes.Equal(again, again2) {
			t.Fatalf("round trip changed the request:\n%s\n%s", again, again2)
		}
	})
}

// TestGrantExpires: a grant is refused after GrantTTL, and past MaxGrants
// unused ones no more are made.
func TestGrantExpires(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	g := newGrants(func() time.Time { return now })
	tok, err := g.issue("cmd_1")
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(GrantTTL)
	if err := g.use("cmd_1", tok); !errors.Is(err, errUnknownGrant) {
		t.Fatalf("expired grant: %v", err)
	}
	for range MaxGrants {
		if _, err := g.issue("cmd_2"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.issue("cmd_3"); !errors.Is(err, errTooManyGrant) {
		t.Fatalf("grant past MaxGrants: %v", err)
	}
	now = now.Add(GrantTTL)
	if _, err := g.issue("cmd_3"); err != nil {
		t.Fatalf("after the others expired: %v", err)
	}
}
