package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/interpreter"
)

// Bounds of a condition.
const (
	// MaxConditionLength is the longest condition, in bytes: 4 KiB.
	MaxConditionLength = 4 << 10
	// MaxConditionCost is the most a condition may cost, in CEL's cost
	// units (about one per value visited or compared, one per ten
	// characters a string operation reads). Compile refuses a condition
	// whose estimated worst case exceeds it, with the inputs at their
	// bounds (strings up to MaxInputString bytes; request.fields,
	// resource.labels and caller.groups up to MaxInputEntries entries; a
	// field's value up to MaxInputEntries entries or bytes), and an
	// evaluation that exceeds it, as one with larger inputs may, is stopped
	// with an error.
	MaxConditionCost = 10_000
	// MaxInputString is the longest string the cost estimate assumes an
	// input holds, in bytes: 4 KiB.
	MaxInputString = 4 << 10
	// MaxInputEntries is the most entries the cost estimate assumes an
	// input list or map holds.
	MaxInputEntries = 64
	// maxConditionNesting bounds how deep a condition's expression nests.
	maxConditionNesting = 32
)

// request is the CEL variable request.
type request struct {
	// SourceIP is the caller's verified address; "" when unknown.
	SourceIP string `cel:"sourceIp"`
	// Time is the call's time.
	Time time.Time `cel:"time"`
	// Method is the action.
	Method string `cel:"method"`
	// Fields are the request's fields.
	Fields map[string]any `cel:"fields"`
}

// celEnv is the one CEL environment conditions are compiled in: made once,
// safe for concurrent use.
var celEnv = sync.OnceValues(newCELEnv)

func newCELEnv() (*cel.Env, error) {
	return cel.NewEnv(
		ext.NativeTypes(reflect.TypeFor[request](), reflect.TypeFor[Resource](), reflect.TypeFor[Principal](),
			ext.ParseStructTags(true)),
		cel.Variable("request", cel.ObjectType("policy.request")),
		cel.Variable("resource", cel.ObjectType("policy.Resource")),
		cel.Variable("caller", cel.ObjectType("policy.Principal")),
		ext.Strings(),
		cel.Function("inCidr",
			cel.Overload("inCidr_string_string", []*cel.Type{cel.StringType, cel.StringType}, cel.BoolType,
				cel.BinaryBinding(inCIDR))),
		cel.CrossTypeNumericComparisons(true),
		cel.ParserExpressionSizeLimit(MaxConditionLength),
		cel.ParserRecursionLimit(maxConditionNesting),
		cel.ExtendedValidations(),
		cel.ASTValidators(cidrLiterals{}),
	)
}

// inCIDR is inCidr(ip, cidr): whether ip lies in cidr; false when ip does
// not parse, an error when cidr does not.
func inCIDR(ip, cidr ref.Val) ref.Val {
	c, ok := cidr.(types.String)
	if !ok {
		return types.MaybeNoSuchOverloadErr(cidr)
	}
	s, ok := ip.(types.String)
	if !ok {
		return types.MaybeNoSuchOverloadErr(ip)
	}
	prefix, err := netip.ParsePrefix(string(c))
	if err != nil {
		return types.NewErr("inCidr: %q is not a CIDR", string(c))
	}
	addr, err := parseAddr(string(s))
	if err != nil {
		return types.False
	}
	return types.Bool(prefix.Contains(addr))
}

// parseAddr parses an IP address, dropping a zone and unmapping an
// IPv4-mapped IPv6 address.
func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	return a.WithZone("").Unmap(), nil
}

// cidrLiterals refuses at compile time an inCidr call whose CIDR is a
// literal that does not parse.
type cidrLiterals struct{}

func (cidrLiterals) Name() string { return "policy.inCidr.literals" }

func (cidrLiterals) Validate(_ *cel.Env, _ cel.ValidatorConfig, a *ast.AST, iss *cel.Issues) {
	for _, call := range ast.MatchDescendants(ast.NavigateAST(a), ast.FunctionMatcher("inCidr")) {
		args := call.AsCall().Args()
		if len(args) != 2 || args[1].Kind() != ast.LiteralKind {
			continue
		}
		s, ok := args[1].AsLiteral().Value().(string)
		if !ok {
			continue
		}
		if _, err := netip.ParsePrefix(s); err != nil {
			iss.ReportErrorAtID(args[1].ID(), "inCidr: %q is not a CIDR", s)
		}
	}
}

// sizes gives the cost estimate the bounds of the inputs: every string
// reached from a variable is at most MaxInputString bytes, every list or
// map at most MaxInputEntries entries, and a request field's value, of
// unknown type, at most MaxInputEntries entries or bytes.
type sizes struct{}

func (sizes) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	if len(n.Path()) == 0 || n.Type() == nil {
		return nil
	}
	switch n.Type().Kind() {
	case types.StringKind, types.BytesKind:
		return &cost.SizeEstimate{Max: MaxInputString}
	case types.ListKind, types.MapKind, types.DynKind:
		// A field's value is of unknown type: a list or map of up to
		// MaxInputEntries entries, or a string of as many bytes.
		return &cost.SizeEstimate{Max: MaxInputEntries}
	}
	return nil
}

func (sizes) EstimateCallCost(function, _ string, _ *cost.AstNode, _ []cost.AstNode) *cost.CallEstimate {
	if function == "inCidr" {
		// Parsing a prefix and an address, each at most a few dozen
		// characters that matter.
		return &cost.CallEstimate{CostEstimate: cost.CostEstimate{Min: 1, Max: 10}}
	}
	return nil
}

// condition is a compiled condition.
type condition struct {
	text string
	prg  cel.Program
}

// compileCondition compiles text: it must parse, type-check to bool, pass
// the literal checks, and cost at most MaxConditionCost at worst.
func compileCondition(text string) (*condition, error) {
	if len(text) > MaxConditionLength {
		return nil, fmt.Errorf("longer than %d bytes", MaxConditionLength)
	}
	env, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("condition environment: %w", err)
	}
	checked, iss := env.Compile(text)
	if iss.Err() != nil {
		msg := strings.ReplaceAll(strings.TrimSpace(iss.Err().Error()), "ERROR: <input>:", "")
		return nil, errors.New(msg)
	}
	if t := checked.OutputType(); !t.IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("condition is of type %s, want bool", t)
	}
	est, err := env.EstimateCost(checked, sizes{})
	if err != nil {
		return nil, fmt.Errorf("estimate cost: %w", err)
	}
	if est.Max > MaxConditionCost {
		return nil, fmt.Errorf("costs up to %d at worst, more than %d: bound the lists it walks or the strings it builds", est.Max, MaxConditionCost)
	}
	prg, err := env.Program(checked, cel.CostLimit(MaxConditionCost), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	return &condition{text: text, prg: prg}, nil
}

// eval evaluates the condition in act.
func (c *condition) eval(act *activation) (bool, error) {
	out, _, err := c.prg.Eval(act)
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("condition gave %s, want bool", out.Type())
	}
	return bool(b), nil
}

// activation holds the variables of one decision, made only when a
// statement with a condition is reached. It holds a copy of the input, so
// that a decision without conditions allocates nothing.
type activation struct {
	in  Input
	req request
}

func newActivation(in *Input) *activation {
	a := &activation{in: *in}
	a.req = request{Time: in.Time, Method: in.Action, Fields: in.Fields}
	if in.SourceIP.IsValid() {
		a.req.SourceIP = in.SourceIP.WithZone("").Unmap().String()
	}
	return a
}

// ResolveName returns request, resource and caller.
func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case "request":
		return &a.req, true
	case "resource":
		return &a.in.Resource, true
	case "caller":
		return &a.in.Principal, true
	}
	return nil, false
}

// Parent returns nil: the activation stands alone.
func (a *activation) Parent() interpreter.Activation { return nil }
