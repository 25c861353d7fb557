package gpudiag

import (
	"errors"
	"strings"
	"testing"
)

// dcgm4 is DCGM 4's shape: "DCGM Diagnostic", entity ids and messages.
const dcgm4 = `Successfully ran diagnostic for group.
{"DCGM Diagnostic": {"test_categories": [
 {"category": "Deployment", "tests": [{"name": "software", "results": [{"status": "Pass"}]}]},
 {"category": "Hardware", "tests": [{"name": "memory", "results": [
   {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
   {"entity_group": "GPU", "entity_id": 3, "status": "FAIL", "warnings": [{"error_category": 1, "error_id": 27, "message": "ECC DBE found"}]}]},
  {"name": "pcie", "results": [{"entity_id": 3, "status": "Skip", "info": ["not run"]}]}]}]}}`

func TestParseDCGM(t *testing.T) {
	r, err := ParseDCGM([]byte(dcgm4), 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.Tool != ToolDCGM || r.Level != 2 || r.Tests != 4 || r.Passed() || len(r.Failures) != 1 {
		t.Fatalf("%+v", r)
	}
	if f := r.Failures[0]; f.Test != "Hardware/memory" || f.GPU != "3" || f.Message != "ECC DBE found (DCGM error 27)" {
		t.Fatalf("failure %+v", f)
	}
	if s := r.Summary(); s != "failed Hardware/memory on GPU 3: ECC DBE found (DCGM error 27)" {
		t.Fatalf("summary %q", s)
	}

	// DCGM 3's shape, info as the message where there is no warning.
	v3 := `{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Integration", "tests": [{"name": "PCIe",
	  "results": [{"gpu_ids": "0", "status": "Fail", "info": "bandwidth below threshold"}, {"gpu_ids": "1", "status": "Pass"}]}]}]}}`
	r, err = ParseDCGM([]byte(v3), 1)
	if err != nil || len(r.Failures) != 1 || r.Failures[0].GPU != "0" || r.Failures[0].Message != "bandwidth below threshold" {
		t.Fatalf("v3: %+v, %v", r, err)
	}
	r, err = ParseDCGM([]byte(strings.ReplaceAll(v3, "Fail", "Pass")), 1)
	if err != nil || !r.Passed() || r.Summary() != "passed 2 tests" {
		t.Fatalf("v3 passing: %+v, %v", r, err)
	}

	// Nothing that proves a pass is a pass.
	for name, out := range map[string]string{
		"empty":         "",
		"banner only":   "Error: unable to establish a connection to the specified host: localhost",
		"other json":    `{"hello": 1}`,
		"no tests":      `{"DCGM GPU Diagnostic": {"test_categories": []}}`,
		"runtime error": `{"DCGM GPU Diagnostic": {"runtime_error": "the GPUs are busy", "test_categories": []}}`,
		"cut":           dcgm4[:len(dcgm4)/2],
	} {
		if _, err := ParseDCGM([]byte(out), 1); err == nil {
			t.Errorf("%s: parsed without error", name)
		} else if name != "runtime error" && !errors.Is(err, ErrNotDCGM) {
			t.Errorf("%s: %v, want ErrNotDCGM", name, err)
		}
	}
}

func TestResultBounds(t *testing.T) {
	var r Result
	long := strings.Repeat("é", MaxText)
	for range MaxFailures + 5 {
		r.Add(Failure{Test: long, GPU: "0", Message: "\xff" + long})
	}
	if len(r.Failures) != MaxFailures || r.More != 5 {
		t.Fatalf("%d failures, %d more", len(r.Failures), r.More)
	}
	for _, f := range r.Failures {
		if len(f.Test) > MaxText || len(f.Message) > MaxText || !strings.HasPrefix(f.Message, "?") {
			t.Fatalf("unbounded or invalid text: %d, %d bytes", len(f.Test), len(f.Message))
		}
	}
	if !strings.HasSuffix(r.Summary(), "and 34 more") {
		t.Fatalf("summary %q", r.Summary()[len(r.Summary())-30:])
	}
}

func FuzzParseDCGM(f *testing.F) {
	f.Add([]byte(dcgm4))
	f.Add([]byte(`{"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"results": [{"status": "Fail", "warnings": ["x", 1, {"warning": "w"}]}]}]}]}}`))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseDCGM(b, 1)
		if err != nil {
			return
		}
		if r.Tests == 0 || len(r.Failures) > MaxFailures {
			t.Fatalf("a result with %d tests and %d failures", r.Tests, len(r.Failures))
		}
		for _, x := range r.Failures {
			if len(x.Test) > MaxText || len(x.GPU) > MaxText || len(x.Message) > MaxText {
				t.Fatal("unbounded text")
			}
		}
	})
}
