package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/policy"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// policyCmd groups the policy commands; they call policies.apply, .test,
// .get and .list (docs/policies.md).
func policyCmd(e *env) *cobra.Command {
	return apiGroup(e, "policy", "Apply, test and read a tenant's policies (allow and deny statements with CEL conditions)",
		policyApplyCmd, policyTestCmd, policyGetCmd, policyListCmd)
}

// readPolicyFile reads a policy file of at most policy.MaxDocumentSize.
func readPolicyFile(path string) (string, error) {
	b, err := readBounded(path, policy.MaxDocumentSize, "a tenant's policy file is at most 1 MiB (docs/policies.md, \"Bounds\")")
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func policyApplyCmd(e *env, af *apiFlags) *cobra.Command {
	var tenant, out string
	var expected int64
	cmd := &cobra.Command{
		Use:   "apply FILE",
		Short: "Replace a tenant's policies with FILE, once its own tests pass",
		Long: `apply sends FILE (YAML: policies and their tests, docs/policies.md) to
policies.apply. The control plane compiles it, runs its tests, and replaces
the tenant's policies only when every test passes and a live token is left
that may still change them; otherwise nothing changes and apply exits 2
(exit 1 for CONFLICT). Every api process decides by the new policies within
5 seconds. The change is audited with its diff, which apply prints.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := readPolicyFile(args[0])
			if err != nil {
				return err
			}
			req := &apiv1.PoliciesApplyRequest{Tenant: tenant, Document: doc}
			if cmd.Flags().Changed("expected-version") {
				if expected < 0 {
					return usageError{errors.New("--expected-version must be 0 or more")}
				}
				req.ExpectedVersion = &expected
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.PoliciesApplyResponse, error) {
					return c.PoliciesApply(ctx, req)
				},
				func(_ *client.Client, r *apiv1.PoliciesApplyResponse) error {
					d := r.GetDocument()
					fmt.Fprintf(e.stdout, "applied version %d to tenant %s: %d policies, %d tests passed\n",
						d.GetVersion(), d.GetTenantId(), len(d.GetPolicies()), len(r.GetTests()))
					if r.GetDiff() != "" {
						fmt.Fprintln(e.stdout, strings.TrimRight(r.GetDiff(), "\n"))
					}
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant id or name (default: the token's own)")
	cmd.Flags().Int64Var(&expected, "expected-version", 0, "apply only if the tenant's policies are still at this version (0: none applied)")
	outputFlag(cmd, &out)
	return cmd
}

func policyTestCmd(e *env, af *apiFlags) *cobra.Command {
	var tenant, out string
	cmd := &cobra.Command{
		Use:   "test FILE",
		Short: "Run FILE's own tests against it without applying it",
		Long: `test sends FILE to policies.test: the control plane compiles it for the
tenant and runs the test cases it carries (caller, action, resource, address
and time, and the decision expected). It prints one line per test and exits
1 when any fails, 2 when FILE does not compile.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := readPolicyFile(args[0])
			if err != nil {
				return err
			}
			var failed bool
			err = runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.PoliciesTestResponse, error) {
					r, err := c.PoliciesTest(ctx, &apiv1.PoliciesTestRequest{Tenant: tenant, Document: doc})
					failed = err == nil && !r.GetPassed()
					return r, err
				},
				func(_ *client.Client, r *apiv1.PoliciesTestResponse) error {
					if len(r.GetResults()) == 0 {
						fmt.Fprintf(e.stdout, "%s compiles; it has no tests\n", args[0])
					}
					for _, t := range r.GetResults() {
						mark := "ok  "
						if !t.GetPassed() {
							mark = "FAIL"
						}
						fmt.Fprintf(e.stdout, "%s %s: want %s, got %s (%s)\n", mark, t.GetName(), t.GetExpect(), t.GetGot(), t.GetReason())
					}
					return nil
				})
			if err == nil && failed {
				return errors.New("policy tests failed")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant id or name the file is for (default: the token's own)")
	outputFlag(cmd, &out)
	return cmd
}

func policyGetCmd(e *env, af *apiFlags) *cobra.Command {
	var tenant, out string
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Print a tenant's policy document as applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.PolicyDocument, error) {
					return c.PoliciesGet(ctx, &apiv1.PoliciesGetRequest{Tenant: tenant})
				},
				func(_ *client.Client, d *apiv1.PolicyDocument) error {
					if d.GetVersion() == 0 {
						fmt.Fprintf(e.stderr, "tenant %s has no policies applied: its tokens hold their built-in roles only\n", d.GetTenantId())
						return nil
					}
					fmt.Fprint(e.stdout, d.GetDocument())
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant id or name (default: the token's own)")
	outputFlag(cmd, &out)
	return cmd
}

func policyListCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the policy documents of the token's tenant and the tenants below it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.PoliciesListResponse, error) {
					ds, err := listAll(ctx, c.PoliciesList,
						func(p *apiv1.Page) *apiv1.PoliciesListRequest { return &apiv1.PoliciesListRequest{Page: p} },
						(*apiv1.PoliciesListResponse).GetDocuments)
					return &apiv1.PoliciesListResponse{Documents: ds}, err
				},
				func(_ *client.Client, r *apiv1.PoliciesListResponse) error {
					return tableOf(e.stdout, []string{"TENANT", "VERSION", "POLICIES", "UPDATED", "BY"}, r.GetDocuments(),
						func(d *apiv1.PolicyDocument) []string {
							return []string{d.GetTenantId(), fmt.Sprint(d.GetVersion()), strings.Join(d.GetPolicies(), ","),
								when(d.GetUpdatedAt()), d.GetUpdatedBy()}
						})
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}
