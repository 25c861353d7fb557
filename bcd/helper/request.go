package helper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Bounds of a Request: a request past any of them is refused before
// anything runs.
const (
	// MaxRequest is the longest request line, in bytes.
	MaxRequest = 1 << 20
	// MaxArgs is the most arguments (argv entries) of an exec.
	MaxArgs = 4096
	// MaxEnv is the most environment variables of an exec.
	MaxEnv = 1024
	// MaxOutputLimit is the largest output cap an exec may ask for, in
	// bytes (commands cap theirs far lower).
	MaxOutputLimit = 64 << 20
)

// errTooLong refuses a request line past MaxRequest.
var errTooLong = fmt.Errorf("request longer than %d bytes", MaxRequest)

// decodeRequest reads one request line (without its newline) and checks it
// against the bounds and the shape its operation needs. The operation
// itself may still be off the allow-list (serve refuses it).
func decodeRequest(line []byte) (Request, error) {
	var req Request
	if len(line) > MaxRequest {
		return req, errTooLong
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&req); err != nil {
		return Request{}, errors.New("malformed request")
	}
	if dec.More() {
		return Request{}, errors.New("malformed request: more than one value")
	}
	switch req.Op {
	case OpExec:
		return req, checkExec(req.Exec, true)
	case OpExecUser:
		return req, checkExec(req.Exec, false)
	case OpGrant:
		if req.Grant == nil {
			return req, errors.New("grant needs an id")
		}
		return req, checkID(req.Grant.ID)
	case OpPinsApply:
		if req.Pins == nil || len(req.Pins.Statement) == 0 || len(req.Pins.Signature) == 0 {
			return req, errors.New("pins.apply needs a statement and its signature")
		}
		return req, nil
	case OpShell:
		if req.Shell == nil {
			return req, errors.New("shell needs the tunnel's id")
		}
		return req, checkID(req.Shell.ID)
	}
	return req, nil
}

// checkExec checks an exec's shape and bounds; a root one needs its
// command id.
func checkExec(spec *ExecSpec, root bool) error {
	switch {
	case spec == nil || len(spec.Argv) == 0 || spec.Argv[0] == "":
		return errors.New("exec needs argv")
	case len(spec.Argv) > MaxArgs:
		return fmt.Errorf("exec: %d arguments, at most %d", len(spec.Argv), MaxArgs)
	case len(spec.Env) > MaxEnv:
		return fmt.Errorf("exec: %d environment variables, at most %d", len(spec.Env), MaxEnv)
	case spec.OutputLimit < 0 || spec.OutputLimit > MaxOutputLimit:
		return fmt.Errorf("exec: output limit %d, want 0 to %d bytes", spec.OutputLimit, MaxOutputLimit)
	}
	for k := range spec.Env {
		if k == "" || bytes.ContainsAny([]byte(k), "=\x00") {
			return fmt.Errorf("exec: environment variable name %q", k)
		}
	}
	if root {
		return checkID(spec.CommandID)
	}
	return nil
}
