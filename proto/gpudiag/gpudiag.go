// Package gpudiag reads the result of a GPU diagnostic run before a GPU returns
// to service (docs/remediation.md, "Diagnostic before return"): NVIDIA DCGM's
// `dcgmi diag -r LEVEL -j` JSON, or the built-in NVML check that stands in
// where DCGM is not installed.
package gpudiag

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Tools that produce a Result.
const (
	// ToolDCGM is NVIDIA DCGM's `dcgmi diag`.
	ToolDCGM = "dcgmi"
	// ToolNVML is the built-in NVML check.
	ToolNVML = "nvml"
)

// Bounds of what a Result keeps from a diagnostic's output: the output is
// the node's, and it reaches the control plane in a command's detail.
const (
	// MaxFailures is the most failures a Result lists; more are counted in
	// Result.More.
	MaxFailures = 32
	// MaxText is the most bytes of a test name, GPU or message kept
	// (cut at a rune boundary).
	MaxText = 256
	// MaxOutput is the most bytes of dcgmi's output ParseDCGM reads.
	MaxOutput = 1 << 20
)

// Failure is one test that did not pass.
type Failure struct {
	// Test names the test, "<category>/<test>" for DCGM ("Hardware/Memory");
	// one of the NVML check's names ("enumerate", "recovery-action",
	// "ecc-uncorrected") for the built-in check.
	Test string `json:"test"`
	// GPU names the GPU: DCGM's GPU id (NVML index), or the UUID where the
	// built-in check knows it; empty for a test of the whole node.
	GPU string `json:"gpu,omitempty"`
	// Message is what the tool said about it.
	Message string `json:"message,omitempty"`
}

// Result is a diagnostic's verdict: passed when Failures is empty.
type Result struct {
	// Tool is ToolDCGM or ToolNVML.
	Tool string `json:"tool"`
	// Level is DCGM's run level (1 to 3); 0 for the built-in check.
	Level int `json:"level"`
	// Tests counts the tests (DCGM's per-GPU results, or the built-in
	// check's readings) that ran.
	Tests int `json:"tests"`
	// Failures lists the tests that failed, at most MaxFailures.
	Failures []Failure `json:"failures,omitempty"`
	// More counts the failures past MaxFailures.
	More int `json:"more,omitempty"`
}

// Passed reports whether every test passed.
func (r *Result) Passed() bool { return len(r.Failures) == 0 }

// Add records a failure, keeping at most MaxFailures and each text within
// MaxText bytes.
func (r *Result) Add(f Failure) {
	if len(r.Failures) >= MaxFailures {
		r.More++
		return
	}
	r.Failures = append(r.Failures, Failure{Test: clip(f.Test), GPU: clip(f.GPU), Message: clip(f.Message)})
}

// Name names the diagnostic that ran: "dcgmi diag -r 2", or "the NVML
// check" for the built-in one.
func (r *Result) Name() string {
	if r.Tool == ToolDCGM {
		return fmt.Sprintf("dcgmi diag -r %d", r.Level)
	}
	return "the NVML check"
}

// Summary says in one line what failed: "Hardware/Memory on GPU 0: ...;
// ..." (at most three failures, then how many more), or "passed N tests".
func (r *Result) Summary() string {
	if r.Passed() {
		return fmt.Sprintf("passed %d tests", r.Tests)
	}
	var parts []string
	for i, f := range r.Failures {
		if i == 3 {
			break
		}
		s := f.Test
		if f.GPU != "" {
			s += " on GPU " + f.GPU
		}
		if f.Message != "" {
			s += ": " + f.Message
		}
		parts = append(parts, s)
	}
	if more := len(r.Failures) - len(parts) + r.More; more > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", more))
	}
	return "failed " + strings.Join(parts, "; ")
}

// clip cuts s to MaxText bytes at a rune boundary and makes it valid UTF-8.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= MaxText {
		return s
	}
	s = s[:MaxText]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// ErrNotDCGM is returned (wrapped) by ParseDCGM for output that holds no
// DCGM diagnostic document.
var ErrNotDCGM = errors.New("no DCGM diagnostic JSON")

// dcgmDoc is `dcgmi diag -j`'s document. DCGM 2 and 3 name it "DCGM GPU
// Diagnostic" and give each result "gpu_ids" and warnings as
// {"warning": ...}; DCGM 4 names it "DCGM Diagnostic" and gives each result
// an "entity_id" and warnings as {"message": ...}. Both are read.
type dcgmDoc struct {
	V3 *dcgmBody `json:"DCGM GPU Diagnostic"`
	V4 *dcgmBody `json:"DCGM Diagnostic"`
}

type dcgmBody struct {
	Categories []struct {
		Category string `json:"category"`
		Tests    []struct {
			Name    string `json:"name"`
			Results []struct {
				Status   string          `json:"status"`
				GPUIDs   json.RawMessage `json:"gpu_ids"`
				EntityID json.RawMessage `json:"entity_id"`
				Info     json.RawMessage `json:"info"`
				Warnings json.RawMessage `json:"warnings"`
			} `json:"results"`
		} `json:"tests"`
	} `json:"test_categories"`
	RuntimeError string `json:"runtime_error"`
}

// ParseDCGM reads the JSON `dcgmi diag -r level -j` printed (at most
// MaxOutput bytes are read; text before the first "{" and after the last
// "}" is skipped, as DCGM may print a banner). A result whose status is
// "Fail" (any case) is a failure, named "<category>/<test>" with its GPU and
// its warnings or info as the message; "Pass", "Skip", "Warn" and "Not
// Run" are not. A document with no test at all, or a runtime_error, is an
// error: a diagnostic that ran nothing proved nothing.
func ParseDCGM(out []byte, level int) (Result, error) {
	if len(out) > MaxOutput {
		return Result{}, fmt.Errorf("%w: the output is over %d bytes", ErrNotDCGM, MaxOutput)
	}
	start, end := strings.IndexByte(string(out), '{'), strings.LastIndexByte(string(out), '}')
	if start < 0 || end < start {
		return Result{}, ErrNotDCGM
	}
	var doc dcgmDoc
	if err := json.Unmarshal(out[start:end+1], &doc); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrNotDCGM, err)
	}
	body := doc.V4
	if body == nil {
		body = doc.V3
	}
	if body == nil {
		return Result{}, fmt.Errorf("%w: no \"DCGM GPU Diagnostic\" or \"DCGM Diagnostic\" object", ErrNotDCGM)
	}
	if body.RuntimeError != "" {
		return Result{}, fmt.Errorf("dcgmi diag could not run: %s", clip(body.RuntimeError))
	}
	r := Result{Tool: ToolDCGM, Level: level}
	for _, c := range body.Categories {
		for _, t := range c.Tests {
			for _, res := range t.Results {
				r.Tests++
				if !strings.EqualFold(strings.TrimSpace(res.Status), "fail") {
					continue
				}
				name := t.Name
				if c.Category != "" {
					name = c.Category + "/" + t.Name
				}
				gpu := text(res.GPUIDs)
				if gpu == "" {
					gpu = text(res.EntityID)
				}
				msg := warnings(res.Warnings)
				if msg == "" {
					msg = text(res.Info)
				}
				r.Add(Failure{Test: name, GPU: gpu, Message: msg})
			}
		}
	}
	if r.Tests == 0 {
		return Result{}, fmt.Errorf("%w: the document lists no test result", ErrNotDCGM)
	}
	return r, nil
}

// text reads a JSON string, number, or list of them as text ("0", "0,1").
func text(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return strings.TrimSpace(s)
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		var parts []string
		for _, e := range list {
			if t := text(e); t != "" {
				parts = append(parts, t)
			}
		}
		return strings.Join(parts, ", ")
	}
	return ""
}

// warnings reads DCGM's warnings: a list of {"warning": ...} (DCGM 3),
// {"message": ...} (DCGM 4) or plain strings, joined with "; ".
func warnings(raw json.RawMessage) string {
	var list []json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &list) != nil {
		return text(raw)
	}
	var parts []string
	for _, e := range list {
		var w struct {
			Warning string `json:"warning"`
			Message string `json:"message"`
			ErrorID *int   `json:"error_id"`
		}
		t := ""
		if json.Unmarshal(e, &w) == nil {
			t = strings.TrimSpace(w.Warning + w.Message)
			if t != "" && w.ErrorID != nil {
				t += " (DCGM error " + strconv.Itoa(*w.ErrorID) + ")"
			}
		} else {
			t = text(e)
		}
		if t != "" {
			parts = append(parts, t)
		}
	}
	return strings.Join(parts, "; ")
}
