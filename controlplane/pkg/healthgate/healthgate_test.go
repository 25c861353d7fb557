package healthgate

import (
	"math"
	"testing"
)

// Known values of the Poisson upper tail P(X >= k), from the probability
// mass function summed exactly (Python's math.factorial; the same figures
// R's ppois(k-1, lambda, lower.tail = FALSE) gives).
func TestPoissonUpperTail(t *testing.T) {
	for _, c := range []struct {
		k      int64
		lambda float64
		want   float64
	}{
		{0, 3, 1},
		{-1, 3, 1},
		{1, 0, 0},
		{0, 0, 1},
		{1, 1, 0.6321205588285577},
		{5, 1, 0.00365984682734366},
		{2, 0.1, 0.0046788401604445085},
		{3, 0.5, 0.014387677966970713},
		{10, 5, 0.03182805730620475},
		{15, 10, 0.08345847293466269},
		{20, 10, 0.0034543419758567007},
		{130, 100, 0.0022820930543169878},
		{30, 0.05, 3.345232720927009e-72},
	} {
		got := PoissonUpperTail(c.k, c.lambda)
		if c.want == 0 && got != 0 || math.Abs(got-c.want) > 1e-12*math.Max(1, c.want) && math.Abs(got/c.want-1) > 1e-9 {
			t.Errorf("PoissonUpperTail(%d, %v) = %v, want %v", c.k, c.lambda, got, c.want)
		}
	}
}

func TestTest(t *testing.T) {
	p := Params{}
	for _, c := range []struct {
		name        string
		m           Measure
		worse, skip bool
		expected    float64
	}{
		// 30 XIDs in 0.1 GPU-hours against 2 in 10: expected 0.02.
		{name: "many more", m: Measure{Upgraded: Group{30, 0.1}, Comparison: Group{2, 10}}, worse: true, expected: 0.02},
		// Same rate: 1 against 10 per 10.
		{name: "same rate", m: Measure{Upgraded: Group{1, 1}, Comparison: Group{10, 10}}, expected: 1},
		// Significant but fewer than 2 events above: one event on a quiet
		// fleet does not halt.
		{name: "one stray event", m: Measure{Upgraded: Group{1, 1}, Comparison: Group{0, 100}}, expected: 0},
		// Two events where none were predicted: p = 0, excess 2.
		{name: "two where none", m: Measure{Upgraded: Group{2, 1}, Comparison: Group{0, 100}}, worse: true, expected: 0},
		// 2 above the prediction but not significant: 7 against 5.
		{name: "excess not significant", m: Measure{Upgraded: Group{7, 1}, Comparison: Group{50, 10}}, expected: 5},
		// Significant and 2 above: 12 against 5 (p = 0.0055).
		{name: "significant", m: Measure{Upgraded: Group{12, 1}, Comparison: Group{50, 10}}, worse: true, expected: 5},
		// No commands ran in the upgraded group: nothing to test.
		{name: "no exposure", m: Measure{Upgraded: Group{0, 0}, Comparison: Group{3, 10}}, skip: true},
		{name: "no comparison", m: Measure{Upgraded: Group{5, 1}, Comparison: Group{0, 0}}, skip: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Test(c.m, p)
			if r.Worse != c.worse || r.Skipped != c.skip || math.Abs(r.Expected-c.expected) > 1e-9 {
				t.Errorf("Test = worse %v skipped %v expected %v (p %v), want %v %v %v", r.Worse, r.Skipped, r.Expected, r.P, c.worse, c.skip, c.expected)
			}
		})
	}
	// Thresholds are configurable: at alpha 0.1, 7 against 5 (p 0.238)
	// still passes; a min excess of 10 keeps 12 against 5 from halting.
	if r := Test(Measure{Upgraded: Group{12, 1}, Comparison: Group{50, 10}}, Params{MinExcess: 10}); r.Worse {
		t.Errorf("12 against 5 with a min excess of 10 halts")
	}
	if r := Test(Measure{Upgraded: Group{9, 1}, Comparison: Group{50, 10}}, Params{Alpha: 0.1}); !r.Worse || r.P > 0.1 {
		t.Errorf("9 against 5 at alpha 0.1 = %+v, want worse", r)
	}
}

func TestDecide(t *testing.T) {
	worse := []Result{{Worse: true}, {}}
	fine := []Result{{}, {Skipped: true}}
	p := Params{MinNodeHours: 1}
	for _, c := range []struct {
		name       string
		results    []Result
		up, cmp    float64
		want       string
		wantParams Params
	}{
		{"harm with little upgraded exposure", worse, 0.01, 5, Halt, p},
		{"harm against a group barely watched", worse, 5, 0.5, Inconclusive, p},
		{"no harm, enough of both", fine, 1, 1, Pass, p},
		{"no harm, upgraded group short", fine, 0.5, 10, Inconclusive, p},
		{"no harm, comparison short", fine, 10, 0.5, Inconclusive, p},
		{"defaults: 1 node-hour", fine, 0.9, 10, Inconclusive, Params{}},
	} {
		if got := Decide(c.results, c.up, c.cmp, c.wantParams); got != c.want {
			t.Errorf("%s: Decide = %s, want %s", c.name, got, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		p  Params
		ok bool
	}{
		{Params{}, true},
		{Params{Alpha: 0.05, MinExcess: 1, MinNodeHours: 0.1}, true},
		{Params{Alpha: 1}, false},
		{Params{Alpha: -0.1}, false},
		{Params{MinExcess: -1}, false},
		{Params{MinNodeHours: -2}, false},
		{Params{MinNodeHours: math.Inf(1)}, false},
	} {
		if err := c.p.Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(%+v) = %v, want ok %v", c.p, err, c.ok)
		}
	}
}
