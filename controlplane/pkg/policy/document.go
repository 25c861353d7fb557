package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"go.yaml.in/yaml/v3"
)

// Bounds of a policy file, checked by Parse.
const (
	// MaxDocumentSize is the largest policy file, in bytes: 1 MiB.
	MaxDocumentSize = 1 << 20
	// MaxPolicies is the most policies one file (one tenant) may hold.
	MaxPolicies = 20_000
	// MaxStatements is the most statements one policy may hold.
	MaxStatements = 100
	// MaxTests is the most test cases one file may hold.
	MaxTests = 1_000
	// MaxListEntries is the most entries any one list of a policy may hold:
	// a binding's tokens, roles or groups, a statement's actions, a
	// selector's tenants, sites, pools or nodes.
	MaxListEntries = 1_000
	// MaxLabels is the most labels a selector or a test's resource may name,
	// and the most fields a test may give.
	MaxLabels = 64
	// MaxNameLength bounds an action, a token id, a group, a selector entry,
	// a label key or value, and a test's name, in bytes.
	MaxNameLength = 256
	// MaxDescriptionLength bounds a policy's description, in bytes.
	MaxDescriptionLength = 1 << 10
	// DefaultRequestDuration is a requestable policy's maxDuration when its
	// request block names none: 8 hours.
	DefaultRequestDuration = 8 * time.Hour
	// MinRequestDuration and MaxRequestDuration bound a requestable
	// policy's maxDuration, and the duration of any access request: 1
	// minute to 7 days.
	MinRequestDuration = time.Minute
	MaxRequestDuration = 7 * 24 * time.Hour
	// MaxDepth is how deep a policy file's YAML may nest lists and maps in
	// one another, the top-level map counting 1. A policy file needs
	// about 13 at most (a test's fields nest); Parse refuses a deeper file
	// before it reads it into a Document.
	MaxDepth = 64
	// maxErrors is how many errors Parse and Compile report before they
	// stop collecting.
	maxErrors = 100
	// maxYAMLErrors is how many YAML decoding errors Parse maps to their
	// place in the file before it only counts them.
	maxYAMLErrors = 10
)

// Effects of a statement, and what a test expects.
const (
	Allow = "allow"
	Deny  = "deny"
)

// Document is one tenant's whole policy set, as a policy file holds it
// (docs/policies.md). Parse makes one and checks it; Compile turns it into a
// Set.
type Document struct {
	// Policies are the tenant's policies. The file must name the key; an
	// empty set is written "policies: []".
	Policies []Policy `yaml:"policies"`
	// Tests are checked against the compiled set before it applies.
	Tests []Test `yaml:"tests,omitempty"`
}

// Policy is a named list of statements bound to callers, or granted to
// them by approved access requests.
type Policy struct {
	// Name matches [a-z0-9][a-z0-9-]{0,62} and is unique in the file.
	Name        string `yaml:"name"`
	Description string `yaml:"description,omitempty"`
	// Bind says whom the policy applies to. It is required unless the
	// policy has a Request block; a requestable policy without one applies
	// only to the holders of its approved, unexpired access requests.
	Bind Binding `yaml:"bind,omitempty"`
	// Request, when set, makes the policy requestable (docs/access.md):
	// who may ask for it, who may approve, and for how long at most.
	Request    *Request    `yaml:"request,omitempty"`
	Statements []Statement `yaml:"statements"`
}

// Request is a requestable policy's request block: a caller its
// Requesters bind may ask for the policy for a time (access.request), a
// caller its Approvers bind, never the one who asked, may approve, and the
// approved request grants the policy's statements to the requester until
// its end (docs/access.md).
type Request struct {
	// Requesters bind who may ask for the policy; at least one entry. A
	// grant holds only while they still bind its holder.
	Requesters Binding `yaml:"requesters"`
	// Approvers bind who may approve or deny a request; at least one
	// entry.
	Approvers Binding `yaml:"approvers"`
	// MaxDuration is the longest time a request may ask for, as Go writes
	// a duration ("30m", "4h", "168h"): DefaultRequestDuration when empty,
	// MinRequestDuration to MaxRequestDuration.
	MaxDuration string `yaml:"maxDuration,omitempty"`
}

// Duration returns r's maxDuration: DefaultRequestDuration when it names
// none. It is 0 for a duration Parse refuses.
func (r *Request) Duration() time.Duration {
	if r.MaxDuration == "" {
		return DefaultRequestDuration
	}
	d, err := time.ParseDuration(r.MaxDuration)
	if err != nil || d < MinRequestDuration || d > MaxRequestDuration {
		return 0
	}
	return d
}

// Binding names the callers a policy applies to: any token listed, every
// token of the tenant with a role listed, and everyone in a group listed.
// At least one entry in all is required.
type Binding struct {
	// Tokens are API token ids.
	Tokens []string `yaml:"tokens,omitempty"`
	// Roles are built-in roles: admin, operator or viewer.
	Roles []string `yaml:"roles,omitempty"`
	// Groups are group names (people signed in through OIDC; tokens have
	// none today).
	Groups []string `yaml:"groups,omitempty"`
}

// Statement allows or denies actions on resources, under a condition.
type Statement struct {
	// Effect is Allow or Deny.
	Effect string `yaml:"effect"`
	// Actions are action names from the Catalog, or patterns in which '*'
	// stands for any run of characters ("nodes.*", "*"). Each must match at
	// least one action of the Catalog.
	Actions []string `yaml:"actions"`
	// Resources, when set, limits the statement to the resources it
	// selects; absent, the statement applies to any resource.
	Resources *Selector `yaml:"resources,omitempty"`
	// NotResources, when set, limits the statement to the resources it does
	// not select (AWS IAM's NotResource). At most one of Resources and
	// NotResources is set.
	NotResources *Selector `yaml:"notResources,omitempty"`
	// Condition, when set, is a CEL expression of type bool that must hold
	// for the statement to apply (docs/policies.md, "Conditions").
	Condition string `yaml:"condition,omitempty"`
}

// Selector selects resources. It matches a resource when every field it
// sets matches; a field it leaves out matches anything. A list entry
// matches the resource's id or its name; a resource without that part (a
// token has no pool) matches no list.
type Selector struct {
	Tenants []string `yaml:"tenants,omitempty"`
	Sites   []string `yaml:"sites,omitempty"`
	Pools   []string `yaml:"pools,omitempty"`
	Nodes   []string `yaml:"nodes,omitempty"`
	// Labels must each be present on the resource with the value given;
	// the value "*" asks only that the key be present.
	Labels map[string]string `yaml:"labels,omitempty"`
}

// Test is one case checked against the compiled set before the set
// applies: a call and the decision it must get.
type Test struct {
	Name   string     `yaml:"name"`
	Caller TestCaller `yaml:"caller"`
	Action string     `yaml:"action"`
	// Resource is what the call acts on.
	Resource Resource `yaml:"resource,omitempty"`
	// SourceIP is the caller's address; empty means unknown.
	SourceIP string `yaml:"sourceIp,omitempty"`
	// Time is the call's time in RFC 3339; empty means DefaultTestTime.
	Time string `yaml:"time,omitempty"`
	// Fields are the request's fields (request.fields in conditions).
	Fields map[string]any `yaml:"fields,omitempty"`
	// Expect is Allow or Deny.
	Expect string `yaml:"expect"`
}

// TestCaller is a test's caller. Its tenant is the tenant of the set under
// test.
type TestCaller struct {
	Token string `yaml:"token,omitempty"`
	// Role is required: admin, operator or viewer.
	Role   string   `yaml:"role"`
	Groups []string `yaml:"groups,omitempty"`
	// Granted names requestable policies of the file the caller holds an
	// approved access request for (TestGrantID), without a resource scope
	// and ending an hour after the test's time: what the policy allows
	// once granted.
	Granted []string `yaml:"granted,omitempty"`
}

// FieldError is one problem found by Parse or Compile, at a place in the
// file such as policies[2].statements[0].condition. Parse and Compile
// return every FieldError they find joined with errors.Join; errors.As
// finds them.
type FieldError struct {
	// Path is the place in the file; empty for the file as a whole.
	Path string
	Err  error
}

// Error returns "path: problem".
func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

// Unwrap returns the problem.
func (e *FieldError) Unwrap() error { return e.Err }

// errorList collects FieldErrors up to maxErrors.
type errorList struct {
	errs    []error
	dropped int
}

func (l *errorList) add(path, format string, args ...any) {
	l.addErr(path, fmt.Errorf(format, args...))
}

func (l *errorList) addErr(path string, err error) {
	if len(l.errs) >= maxErrors {
		l.dropped++
		return
	}
	l.errs = append(l.errs, &FieldError{Path: path, Err: err})
}

func (l *errorList) err() error {
	if l.dropped > 0 {
		l.errs = append(l.errs, fmt.Errorf("and %d more errors", l.dropped))
	}
	return errors.Join(l.errs...)
}

// Parse reads a policy file: YAML, strictly (an unknown key, a duplicate
// key or a second document is an error), within the bounds above, and
// checks everything that needs no Catalog. Every error names its place,
// such as "policies[2].statements[0].effect: want allow or deny"; all of
// them are joined, except that only the first few YAML decoding errors
// (a list where a map belongs, an unknown key) are placed and the rest
// counted. A file nested more than MaxDepth deep is refused before it is
// decoded, so Parse's time and memory grow with the file's size alone.
func Parse(src []byte) (*Document, error) {
	if len(src) > MaxDocumentSize {
		return nil, fmt.Errorf("policy file is %d bytes, more than %d", len(src), MaxDocumentSize)
	}
	// The file's first document as a tree: its depth is checked before
	// the strict decoding below, and its lines place that decoding's
	// errors. Syntax errors are left to the decoder, which reports the
	// same ones.
	var tree yaml.Node
	root := &tree
	if yaml.Unmarshal(src, root) != nil {
		root = nil
	} else if line, deep := tooDeep(root, 0); deep {
		return nil, fmt.Errorf("policy file: line %d: nested more than %d deep", line, MaxDepth)
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	var doc Document
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("policy file is empty: write \"policies: []\" for no policies")
		}
		return nil, yamlError(root, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("policy file holds more than one YAML document")
	}
	var l errorList
	doc.check(&l)
	if err := l.err(); err != nil {
		return nil, err
	}
	return &doc, nil
}

// Canonical returns the document as YAML in one form: keys in the order of
// the types above, maps sorted by key, lists of plain values on one line
// ("actions: [nodes.drain, nodes.shell]"), two-space indentation. Parse
// reads it back to the same Document, within MaxDocumentSize: the
// canonical form of a file written compactly may be longer than the file.
func (d *Document) Canonical() ([]byte, error) {
	var n yaml.Node
	if err := n.Encode(d); err != nil {
		return nil, fmt.Errorf("encode policy document: %w", err)
	}
	flowLists(&n)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, fmt.Errorf("encode policy document: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode policy document: %w", err)
	}
	return b.Bytes(), nil
}

// flowLists sets every non-empty list of scalars under n to flow style.
func flowLists(n *yaml.Node) {
	if n.Kind == yaml.SequenceNode && len(n.Content) > 0 {
		scalars := true
		for _, c := range n.Content {
			scalars = scalars && c.Kind == yaml.ScalarNode
		}
		if scalars {
			n.Style = yaml.FlowStyle
		}
	}
	for _, c := range n.Content {
		flowLists(c)
	}
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func (d *Document) check(l *errorList) {
	if d.Policies == nil {
		l.add("policies", "required: write \"policies: []\" for no policies")
	}
	if len(d.Policies) > MaxPolicies {
		l.add("policies", "%d policies, more than %d", len(d.Policies), MaxPolicies)
		return
	}
	if len(d.Tests) > MaxTests {
		l.add("tests", "%d tests, more than %d", len(d.Tests), MaxTests)
		return
	}
	names := make(map[string]int, len(d.Policies))
	for i := range d.Policies {
		p := &d.Policies[i]
		path := fmt.Sprintf("policies[%d]", i)
		switch {
		case p.Name == "":
			l.add(path+".name", "required")
		case !nameRE.MatchString(p.Name):
			l.add(path+".name", "%q: want lower-case letters, digits and '-', starting with a letter or digit, at most 63", p.Name)
		default:
			if j, dup := names[p.Name]; dup {
				l.add(path+".name", "%q is also the name of policies[%d]", p.Name, j)
			} else {
				names[p.Name] = i
			}
		}
		if len(p.Description) > MaxDescriptionLength {
			l.add(path+".description", "longer than %d bytes", MaxDescriptionLength)
		}
		if p.Request == nil || !p.Bind.empty() {
			p.Bind.check(l, path+".bind", "required: at least one of tokens, roles or groups (or a request block, for a policy granted on request only)")
		}
		p.Request.check(l, path+".request")
		switch {
		case len(p.Statements) == 0:
			l.add(path+".statements", "required: at least one statement")
		case len(p.Statements) > MaxStatements:
			l.add(path+".statements", "%d statements, more than %d", len(p.Statements), MaxStatements)
		default:
			for j := range p.Statements {
				p.Statements[j].check(l, fmt.Sprintf("%s.statements[%d]", path, j))
			}
		}
	}
	tests := make(map[string]int, len(d.Tests))
	for i := range d.Tests {
		t := &d.Tests[i]
		path := fmt.Sprintf("tests[%d]", i)
		switch {
		case t.Name == "":
			l.add(path+".name", "required")
		case len(t.Name) > MaxNameLength:
			l.add(path+".name", "longer than %d bytes", MaxNameLength)
		default:
			if j, dup := tests[t.Name]; dup {
				l.add(path+".name", "%q is also the name of tests[%d]", t.Name, j)
			} else {
				tests[t.Name] = i
			}
		}
		t.check(l, path)
		for j, name := range t.Caller.Granted {
			switch i, ok := names[name]; {
			case name == "":
			case !ok:
				l.add(fmt.Sprintf("%s.caller.granted[%d]", path, j), "%q: no policy of this file has that name", name)
			case d.Policies[i].Request == nil:
				l.add(fmt.Sprintf("%s.caller.granted[%d]", path, j), "%q: that policy has no request block, so it is never granted", name)
			}
		}
	}
}

// empty reports whether b names no one.
func (b *Binding) empty() bool { return len(b.Tokens)+len(b.Roles)+len(b.Groups) == 0 }

// check checks b, required saying what to write when it is empty.
func (b *Binding) check(l *errorList, path, required string) {
	if b.empty() {
		l.add(path, "%s", required)
		return
	}
	checkList(l, path+".tokens", b.Tokens, nil)
	checkList(l, path+".roles", b.Roles, func(r string) error {
		if !iam.ValidRole(r) {
			return fmt.Errorf("%q: want admin, operator or viewer", r)
		}
		return nil
	})
	checkList(l, path+".groups", b.Groups, nil)
}

// check checks a request block, if any.
func (r *Request) check(l *errorList, path string) {
	if r == nil {
		return
	}
	r.Requesters.check(l, path+".requesters", "required: who may ask for the policy (tokens, roles or groups)")
	r.Approvers.check(l, path+".approvers", "required: who may approve a request (tokens, roles or groups)")
	if r.MaxDuration == "" {
		return
	}
	d, err := time.ParseDuration(r.MaxDuration)
	switch {
	case len(r.MaxDuration) > MaxNameLength:
		l.add(path+".maxDuration", "longer than %d bytes", MaxNameLength)
	case err != nil:
		l.add(path+".maxDuration", "%q: want a duration such as 30m, 4h or 168h", r.MaxDuration)
	case d < MinRequestDuration || d > MaxRequestDuration:
		l.add(path+".maxDuration", "%s: want %v to %v", r.MaxDuration, MinRequestDuration, MaxRequestDuration)
	}
}

func (s *Statement) check(l *errorList, path string) {
	switch s.Effect {
	case Allow, Deny:
	case "":
		l.add(path+".effect", "required: allow or deny")
	default:
		l.add(path+".effect", "%q: want allow or deny", s.Effect)
	}
	if len(s.Actions) == 0 {
		l.add(path+".actions", "required: at least one action")
	}
	checkList(l, path+".actions", s.Actions, func(a string) error {
		if err := checkActionName(a, true); err != nil {
			return fmt.Errorf("%q: %w", a, err)
		}
		return nil
	})
	if s.Resources != nil && s.NotResources != nil {
		l.add(path, "at most one of resources and notResources")
	}
	s.Resources.check(l, path+".resources")
	s.NotResources.check(l, path+".notResources")
	if len(s.Condition) > MaxConditionLength {
		l.add(path+".condition", "longer than %d bytes", MaxConditionLength)
	} else if s.Condition != "" && strings.TrimSpace(s.Condition) == "" {
		l.add(path+".condition", "blank")
	}
}

func (s *Selector) check(l *errorList, path string) {
	if s == nil {
		return
	}
	if len(s.Tenants)+len(s.Sites)+len(s.Pools)+len(s.Nodes)+len(s.Labels) == 0 {
		l.add(path, "empty selector: name tenants, sites, pools, nodes or labels, or leave it out to match any resource")
		return
	}
	checkList(l, path+".tenants", s.Tenants, nil)
	checkList(l, path+".sites", s.Sites, nil)
	checkList(l, path+".pools", s.Pools, nil)
	checkList(l, path+".nodes", s.Nodes, nil)
	checkLabels(l, path+".labels", s.Labels)
}

func (t *Test) check(l *errorList, path string) {
	switch {
	case t.Caller.Role == "":
		l.add(path+".caller.role", "required: admin, operator or viewer")
	case !iam.ValidRole(t.Caller.Role):
		l.add(path+".caller.role", "%q: want admin, operator or viewer", t.Caller.Role)
	}
	if len(t.Caller.Token) > MaxNameLength {
		l.add(path+".caller.token", "longer than %d bytes", MaxNameLength)
	}
	checkList(l, path+".caller.groups", t.Caller.Groups, nil)
	checkList(l, path+".caller.granted", t.Caller.Granted, nil)
	if t.Action == "" {
		l.add(path+".action", "required")
	} else if err := checkActionName(t.Action, false); err != nil {
		l.add(path+".action", "%q: %v", t.Action, err)
	}
	r := &t.Resource
	for _, f := range []struct{ name, v string }{
		{"tenant", r.Tenant}, {"tenantName", r.TenantName}, {"site", r.Site}, {"siteName", r.SiteName},
		{"pool", r.Pool}, {"poolName", r.PoolName}, {"node", r.Node}, {"nodeName", r.NodeName},
	} {
		if len(f.v) > MaxNameLength {
			l.add(path+".resource."+f.name, "longer than %d bytes", MaxNameLength)
		}
	}
	checkLabels(l, path+".resource.labels", r.Labels)
	if t.SourceIP != "" {
		if _, err := parseAddr(t.SourceIP); err != nil {
			l.add(path+".sourceIp", "%q: not an IP address", t.SourceIP)
		}
	}
	if t.Time != "" {
		if _, err := parseTime(t.Time); err != nil {
			l.add(path+".time", "%q: want RFC 3339, like 2026-12-07T10:00:00Z", t.Time)
		}
	}
	if len(t.Fields) > MaxLabels {
		l.add(path+".fields", "%d fields, more than %d", len(t.Fields), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(t.Fields)) {
		if err := checkField(t.Fields[k], 0); err != nil {
			l.add(path+".fields."+k, "%v", err)
		}
	}
	switch t.Expect {
	case Allow, Deny:
	case "":
		l.add(path+".expect", "required: allow or deny")
	default:
		l.add(path+".expect", "%q: want allow or deny", t.Expect)
	}
}

// maxFieldDepth bounds how deep a test's fields nest.
const maxFieldDepth = 8

// checkField checks a test's field value: null, a bool, a number, a string,
// a timestamp, or a list or map (string keys) of these, nested at most
// maxFieldDepth deep.
func checkField(v any, depth int) error {
	if depth > maxFieldDepth {
		return fmt.Errorf("nested more than %d deep", maxFieldDepth)
	}
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			if err := checkField(e, depth+1); err != nil {
				return err
			}
		}
	case map[string]any:
		for _, e := range v {
			if err := checkField(e, depth+1); err != nil {
				return err
			}
		}
	case map[any]any:
		return errors.New("a map's keys must be strings")
	}
	return nil
}

func checkList(l *errorList, path string, list []string, check func(string) error) {
	if len(list) > MaxListEntries {
		l.add(path, "%d entries, more than %d", len(list), MaxListEntries)
		return
	}
	seen := make(map[string]bool, len(list))
	for i, v := range list {
		p := path + "[" + strconv.Itoa(i) + "]"
		switch {
		case v == "":
			l.add(p, "empty")
		case len(v) > MaxNameLength:
			l.add(p, "longer than %d bytes", MaxNameLength)
		case seen[v]:
			l.add(p, "%q listed twice", v)
		case check != nil:
			if err := check(v); err != nil {
				l.addErr(p, err)
			}
		}
		seen[v] = true
	}
}

func checkLabels(l *errorList, path string, labels map[string]string) {
	if len(labels) > MaxLabels {
		l.add(path, "%d labels, more than %d", len(labels), MaxLabels)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		v := labels[k]
		switch {
		case k == "":
			l.add(path, "empty key")
		case len(k) > MaxNameLength:
			l.add(path+"."+k[:32], "key longer than %d bytes", MaxNameLength)
		case len(v) > MaxNameLength:
			l.add(path+"."+k, "value longer than %d bytes", MaxNameLength)
		}
	}
}

// tooDeep reports whether n nests lists and maps more than MaxDepth deep,
// depth being how many enclose n, and the line of the first one past the
// bound. It stops there, so it reads at most MaxDepth+1 levels; aliases
// are not followed (their anchors are checked where they stand).
func tooDeep(n *yaml.Node, depth int) (int, bool) {
	switch n.Kind {
	case yaml.SequenceNode, yaml.MappingNode:
		depth++
		if depth > MaxDepth {
			return n.Line, true
		}
	case yaml.DocumentNode:
	default:
		return 0, false
	}
	for _, c := range n.Content {
		if line, deep := tooDeep(c, depth); deep {
			return line, true
		}
	}
	return 0, false
}

// yamlError turns a YAML decoding error into one naming the place of each
// of the first maxYAMLErrors problems, found in root (the file's tree)
// from the line numbers the decoder reports; the rest are counted. A nil
// root (the file did not parse) places none.
func yamlError(root *yaml.Node, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) || root == nil {
		return fmt.Errorf("policy file: %w", err)
	}
	var l errorList
	for i, msg := range te.Errors {
		if i == maxYAMLErrors {
			l.dropped = len(te.Errors) - i
			break
		}
		line, rest, ok := lineOf(msg)
		if !ok {
			l.add("", "%s", msg)
			continue
		}
		l.add(pathAtLine(root, line), "line %d: %s", line, rest)
	}
	return l.err()
}

// lineOf splits "line 12: problem" into 12 and "problem".
func lineOf(msg string) (int, string, bool) {
	rest, ok := strings.CutPrefix(msg, "line ")
	if !ok {
		return 0, msg, false
	}
	num, rest, ok := strings.Cut(rest, ": ")
	if !ok {
		return 0, msg, false
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return 0, msg, false
	}
	return n, rest, true
}

// pathAtLine returns the path of the last node, in document order, that
// starts on line, such as "policies[2].statements[0]" (the list entries
// and map keys on the line, the deepest of them when they nest); "" when
// none does.
//
// Nodes follow one another in the file, each after the one before it and
// its children within it, so that node lies under the last child of each
// list or map that starts on or before line: it descends that one branch,
// finding each child by binary search, and writes the path of that branch
// alone.
func pathAtLine(n *yaml.Node, line int) string {
	var b strings.Builder
	best := -1
	for n != nil {
		switch n.Kind {
		case yaml.DocumentNode:
			if len(n.Content) == 0 {
				return ""
			}
			n = n.Content[0]
		case yaml.SequenceNode:
			i := sort.Search(len(n.Content), func(i int) bool { return n.Content[i].Line > line }) - 1
			if i < 0 {
				n = nil
				break
			}
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(i))
			b.WriteByte(']')
			n = n.Content[i]
			if n.Line == line {
				best = b.Len()
			}
		case yaml.MappingNode:
			i := sort.Search(len(n.Content)/2, func(i int) bool { return n.Content[2*i].Line > line }) - 1
			if i < 0 {
				n = nil
				break
			}
			k := n.Content[2*i]
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(k.Value)
			if k.Line == line {
				best = b.Len()
			}
			n = n.Content[2*i+1]
		default:
			n = nil
		}
	}
	if best < 0 {
		return ""
	}
	return b.String()[:best]
}
