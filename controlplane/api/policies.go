package api

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/policy"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// MaxPolicyDocumentBytes bounds a policy document (policy.Parse's bound).
const MaxPolicyDocumentBytes = policy.MaxDocumentSize

// policiesApply replaces a tenant's policy document after its own tests
// pass and a live token is left that may still change the tenant's
// policies (docs/policies.md, "Applying").
func (s *Server) policiesApply(ctx context.Context, p *iam.Principal, r *apiv1.PoliciesApplyRequest) (*apiv1.PoliciesApplyResponse, error) {
	t, err := s.tenant(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	doc, set, results, err := s.compileDocument(t.ID, r.GetDocument())
	if err != nil {
		return nil, err
	}
	if failed := failedTests(results); failed != "" {
		return nil, invalid("document", "its own tests fail, so nothing was applied: %s", failed)
	}
	if err := s.keepsPolicyAdmin(ctx, t, set); err != nil {
		return nil, err
	}
	expected := int64(store.AnyPolicyVersion)
	if r.ExpectedVersion != nil {
		if r.GetExpectedVersion() < 0 {
			return nil, invalid("expectedVersion", "must be 0 or more")
		}
		expected = r.GetExpectedVersion()
	}
	var old *policy.Document
	if prev, err := s.store.PolicyDocumentGet(ctx, t.ID); err == nil {
		old, _ = policy.Parse([]byte(prev.Document))
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	diff := policy.Diff(old, doc)
	stored, err := s.store.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: t.ID, Document: r.GetDocument(),
		Names: policyNames(doc), UpdatedBy: "token:" + p.TokenID}, expected)
	if errors.Is(err, store.ErrConflict) {
		return nil, &Error{Code: apiv1.CodeConflict, Field: "expectedVersion", Message: fmt.Sprintf(
			"tenant %s's policies changed since version %d: get them again and re-apply", t.ID, expected)}
	}
	if err != nil {
		return nil, err
	}
	noteAudit(ctx, "diff", diff)
	noteAudit(ctx, "version", fmt.Sprint(stored.Version))
	s.policies.changed() // this process decides by it at once; the others within PolicyRefresh
	out := &apiv1.PoliciesApplyResponse{Document: policyDocumentOut(stored), Diff: diff}
	for _, res := range results {
		out.Tests = append(out.Tests, testResultOut(res))
	}
	return out, nil
}

// policiesGet returns a tenant's document, or version 0 and no text.
func (s *Server) policiesGet(ctx context.Context, p *iam.Principal, r *apiv1.PoliciesGetRequest) (*apiv1.PolicyDocument, error) {
	t, err := s.tenant(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	d, err := s.store.PolicyDocumentGet(ctx, t.ID)
	if errors.Is(err, store.ErrNotFound) {
		return &apiv1.PolicyDocument{TenantId: t.ID}, nil
	}
	if err != nil {
		return nil, err
	}
	return policyDocumentOut(d), nil
}

// policiesList pages the documents of the caller's subtree, without text.
func (s *Server) policiesList(ctx context.Context, p *iam.Principal, r *apiv1.PoliciesListRequest) (*apiv1.PoliciesListResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	lp.Within = within(p)
	ds, err := s.store.PolicyDocumentList(ctx, &lp)
	if err != nil {
		return nil, err
	}
	out := &apiv1.PoliciesListResponse{NextCursor: next(ds, lp, func(d *store.PolicyDocument) string { return d.TenantID })}
	for _, d := range ds {
		o := policyDocumentOut(d)
		o.Document = ""
		out.Documents = append(out.Documents, o)
	}
	return out, nil
}

// policiesTest compiles a document and runs its tests without applying it.
func (s *Server) policiesTest(ctx context.Context, p *iam.Principal, r *apiv1.PoliciesTestRequest) (*apiv1.PoliciesTestResponse, error) {
	t, err := s.tenant(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	_, _, results, err := s.compileDocument(t.ID, r.GetDocument())
	if err != nil {
		return nil, err
	}
	out := &apiv1.PoliciesTestResponse{Passed: failedTests(results) == ""}
	for _, res := range results {
		out.Results = append(out.Results, testResultOut(res))
	}
	return out, nil
}

// compileDocument parses and compiles a tenant's document against the
// API's catalog and runs its tests: INVALID_ARGUMENT naming the first
// places that are wrong.
func (s *Server) compileDocument(tenantID, text string) (*policy.Document, *policy.Set, []policy.TestResult, error) {
	if len(text) > MaxPolicyDocumentBytes {
		return nil, nil, nil, invalid("document", "is %d bytes, at most %d", len(text), MaxPolicyDocumentBytes)
	}
	doc, err := policy.Parse([]byte(text))
	if err != nil {
		return nil, nil, nil, invalid("document", "%s", firstErrors(err))
	}
	set, err := policy.Compile(tenantID, doc, s.policies.catalog)
	if err != nil {
		return nil, nil, nil, invalid("document", "%s", firstErrors(err))
	}
	return doc, set, doc.RunTests(set), nil
}

// keepsPolicyAdmin refuses (CONFLICT) a set under which no live token of
// the tenant, or of a tenant above it, could call policies.apply on it,
// whatever the call's address, time and fields: decided in the worst case
// (policy.Set.DecideWorstCase: a deny's condition taken to hold, an
// allow's to fail), on the resource a real apply is decided on.
func (s *Server) keepsPolicyAdmin(ctx context.Context, t *store.Tenant, set *policy.Set) error {
	toks, err := s.store.APITokenList(ctx, &store.ListParams{Limit: store.MaxListLimit})
	if err != nil {
		return err
	}
	now := s.now()
	for cursor := ""; ; {
		for _, tok := range toks {
			cursor = tok.ID
			if tok.RevokedAt != nil || (tok.ExpiresAt != nil && !tok.ExpiresAt.After(now)) {
				continue
			}
			owner, err := s.store.TenantGet(ctx, tok.TenantID)
			if err != nil || owner.DeletedAt != nil || !t.Within(owner.Path) {
				continue
			}
			in := policy.Input{Principal: policy.Principal{Token: tok.ID, Tenant: tok.TenantID, Role: tok.Role},
				Action: "policies.apply", Resource: policy.Resource{Tenant: t.ID, TenantName: t.Name}, Time: now}
			if owner.ID != t.ID {
				// A token above the tenant is decided by its own tenant's
				// policies, which this apply does not change.
				v, err := s.policies.current(ctx)
				if err != nil {
					return err
				}
				if v.DecideWorstCase(in).Allow {
					return nil
				}
				continue
			}
			if set.DecideWorstCase(in).Allow {
				return nil
			}
		}
		if len(toks) < store.MaxListLimit {
			break
		}
		if toks, err = s.store.APITokenList(ctx, &store.ListParams{Cursor: cursor, Limit: store.MaxListLimit}); err != nil {
			return err
		}
	}
	return &Error{Code: apiv1.CodeConflict, Field: "document", Message: fmt.Sprintf(
		"it would leave no live token able to change tenant %s's policies (policies.apply): nothing was applied", t.ID)}
}

// failedTests names the failed tests, "" when all passed.
func failedTests(results []policy.TestResult) string {
	var failed []string
	for _, r := range results {
		if !r.Passed() {
			failed = append(failed, fmt.Sprintf("%q wants %s, got %s (%s)", r.Name, r.Want, r.Got, r.Reason))
		}
	}
	if len(failed) > 5 {
		failed = append(failed[:5], fmt.Sprintf("and %d more", len(failed)-5))
	}
	return strings.Join(failed, "; ")
}

// firstErrors is the first few of Parse's or Compile's joined errors.
func firstErrors(err error) string {
	lines := strings.Split(err.Error(), "\n")
	if len(lines) > 10 {
		lines = append(lines[:10], fmt.Sprintf("and %d more", len(lines)-10))
	}
	return strings.Join(lines, "; ")
}

func policyNames(d *policy.Document) []string {
	names := make([]string, 0, len(d.Policies))
	for _, p := range d.Policies {
		names = append(names, p.Name)
	}
	return names
}

func policyDocumentOut(d *store.PolicyDocument) *apiv1.PolicyDocument {
	return &apiv1.PolicyDocument{TenantId: d.TenantID, Document: d.Document, Version: d.Version,
		UpdatedAt: timestamppb.New(d.UpdatedAt), UpdatedBy: d.UpdatedBy, Policies: d.Names}
}

func testResultOut(r policy.TestResult) *apiv1.PolicyTestResult {
	return &apiv1.PolicyTestResult{Name: r.Name, Expect: r.Want, Got: r.Got, Reason: r.Reason, Passed: r.Passed()}
}
