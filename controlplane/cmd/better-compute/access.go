package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/policy"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// accessCmd groups the access request commands; they call access.request,
// .list, .approve, .deny and .revoke (docs/access.md).
func accessCmd(e *env) *cobra.Command {
	return apiGroup(e, "access", "Ask for a requestable policy for a time, approve, deny and revoke access requests",
		accessRequestCmd, accessListCmd, accessApproveCmd, accessDenyCmd, accessRevokeCmd)
}

// accessScopeKinds are the kinds --resource takes.
var accessScopeKinds = []string{store.AccessScopePool, store.AccessScopeSite, store.AccessScopeNode, store.AccessScopeTenant}

func accessRequestCmd(e *env, af *apiFlags) *cobra.Command {
	var pol, resource, reason, out string
	var dur time.Duration
	cmd := &cobra.Command{
		Use:   "request --policy P --for DURATION --reason TEXT [--resource KIND:NAME]",
		Short: "Ask for a requestable policy of your tenant for a time, with a reason",
		Long: `request sends access.request: a request for policy P (one with a request block
in your tenant's policy file, whose requesters name you) for DURATION, with
TEXT for the approver. It prints the request's id and state (pending). An
approver the policy names approves it (access approve ID); the policy's
statements then apply to you from the approval for DURATION, and the
shells and tunnels they allowed close at its end. --resource limits what
the policy allows to one pool, site, node or tenant (pool:gpu-a). A request
not decided within 24 hours expires.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case pol == "":
				return usageError{errors.New("--policy is required: the requestable policy to ask for")}
			case !cmd.Flags().Changed("for"):
				return usageError{errors.New("--for is required: how long the access lasts once approved (30m, 2h)")}
			case dur < policy.MinRequestDuration || dur > policy.MaxRequestDuration:
				return usageError{fmt.Errorf("--for %v: want %v to %v (and at most the policy's maxDuration)", dur,
					policy.MinRequestDuration, policy.MaxRequestDuration)}
			case strings.TrimSpace(reason) == "":
				return usageError{errors.New("--reason is required: say why, for the approver and the audit log")}
			}
			if resource != "" {
				kind, name, ok := strings.Cut(resource, ":")
				if !ok || name == "" || !slices.Contains(accessScopeKinds, kind) {
					return usageError{fmt.Errorf("--resource %q: want KIND:NAME_OR_ID, KIND one of %s (pool:gpu-a)",
						resource, strings.Join(accessScopeKinds, ", "))}
				}
			}
			req := &apiv1.RequestAccessRequest{Policy: pol, Resource: resource, Duration: durationpb.New(dur), Reason: reason}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.AccessRequest, error) {
					return c.AccessRequest(ctx, req)
				},
				func(_ *client.Client, r *apiv1.AccessRequest) error {
					fmt.Fprintf(e.stdout, "access request %s is %s: policy %s for %v%s; an approver of the policy approves it with: access approve %s\n",
						r.GetId(), r.GetState(), r.GetPolicy(), r.GetDuration().AsDuration(), onResource(r), r.GetId())
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&pol, "policy", "", "the requestable policy to ask for (required)")
	cmd.Flags().StringVar(&resource, "resource", "", "limit the access to one resource: pool:NAME, site:NAME, node:ID or tenant:NAME")
	cmd.Flags().DurationVar(&dur, "for", 0, "how long the access lasts once approved, such as 30m or 2h (required)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the approver and the audit log (required, at most 1 KiB)")
	outputFlag(cmd, &out)
	return cmd
}

// onResource is " on KIND NAME" for a request with a scope, else "".
func onResource(r *apiv1.AccessRequest) string {
	if r.GetResource() == "" {
		return ""
	}
	kind, _, _ := strings.Cut(r.GetResource(), ":")
	return " on " + kind + " " + r.GetResourceName()
}

func accessListCmd(e *env, af *apiFlags) *cobra.Command {
	var state, out string
	var mine bool
	cmd := &cobra.Command{
		Use:   "list [--state STATE] [--mine]",
		Short: "List the access requests of your tenant and the tenants below it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if state != "" && !slices.Contains(store.AccessStates, state) {
				return usageError{fmt.Errorf("--state %q: want one of %s", state, strings.Join(store.AccessStates, ", "))}
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListAccessRequestsResponse, error) {
					rs, err := listAll(ctx, c.AccessList,
						func(p *apiv1.Page) *apiv1.ListAccessRequestsRequest {
							return &apiv1.ListAccessRequestsRequest{Page: p, State: state, Mine: mine}
						},
						(*apiv1.ListAccessRequestsResponse).GetRequests)
					// Newest first.
					slices.SortStableFunc(rs, func(a, b *apiv1.AccessRequest) int {
						return b.GetCreateTime().AsTime().Compare(a.GetCreateTime().AsTime())
					})
					return &apiv1.ListAccessRequestsResponse{Requests: rs}, err
				},
				func(_ *client.Client, r *apiv1.ListAccessRequestsResponse) error {
					return tableOf(e.stdout, []string{"ID", "STATE", "POLICY", "RESOURCE", "REQUESTER", "FOR", "CREATED", "END", "DECIDED BY", "REASON"},
						r.GetRequests(), func(x *apiv1.AccessRequest) []string {
							res := "-"
							if x.GetResource() != "" {
								kind, _, _ := strings.Cut(x.GetResource(), ":")
								res = kind + ":" + x.GetResourceName()
							}
							return []string{x.GetId(), x.GetState(), x.GetPolicy(), res, x.GetRequester(), x.GetDuration().AsDuration().String(),
								when(x.GetCreateTime()), when(x.GetEnd()), orDash(x.GetDecidedBy()), cut(oneLine(x.GetReason()), 60)}
						})
				})
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only requests in this state: "+strings.Join(store.AccessStates, ", "))
	cmd.Flags().BoolVar(&mine, "mine", false, "only your own requests")
	outputFlag(cmd, &out)
	return cmd
}

// cut is v cut to n characters.
func cut(v string, n int) string {
	if r := []rune(v); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return v
}

func accessApproveCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "approve ID",
		Short: "Approve a pending access request (an approver its policy names; never your own)",
		Long: `approve sends access.approve: the request's policy applies to its requester
from now for the duration asked, then ends by itself. Only a caller of the
request's tenant that the policy's request.approvers name may approve, and
never the requester (exit 1, PERMISSION_DENIED); a request another approver
decided first, or that expired, is CONFLICT (exit 1).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.AccessRequest, error) {
					return c.AccessApprove(ctx, &apiv1.ApproveAccessRequest{Id: args[0]})
				},
				func(_ *client.Client, r *apiv1.AccessRequest) error {
					fmt.Fprintf(e.stdout, "access request %s approved: policy %s%s for %s until %s\n",
						r.GetId(), r.GetPolicy(), onResource(r), r.GetRequester(), when(r.GetEnd()))
					return nil
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

func accessDenyCmd(e *env, af *apiFlags) *cobra.Command {
	var reason, out string
	cmd := &cobra.Command{
		Use:   "deny ID [--reason TEXT]",
		Short: "Deny a pending access request (an approver its policy names)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.AccessRequest, error) {
					return c.AccessDeny(ctx, &apiv1.DenyAccessRequest{Id: args[0], Reason: reason})
				},
				func(_ *client.Client, r *apiv1.AccessRequest) error {
					fmt.Fprintf(e.stdout, "access request %s denied\n", r.GetId())
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the requester (at most 1 KiB)")
	outputFlag(cmd, &out)
	return cmd
}

func accessRevokeCmd(e *env, af *apiFlags) *cobra.Command {
	var reason, out string
	cmd := &cobra.Command{
		Use:   "revoke ID [--reason TEXT]",
		Short: "End a pending or approved access request (its requester, or an approver)",
		Long: `revoke sends access.revoke: a pending request is withdrawn; an approved one's
access ends now, and the shells and port forwards it allowed close within
seconds, each with one line saying so.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.AccessRequest, error) {
					return c.AccessRevoke(ctx, &apiv1.RevokeAccessRequest{Id: args[0], Reason: reason})
				},
				func(_ *client.Client, r *apiv1.AccessRequest) error {
					fmt.Fprintf(e.stdout, "access request %s revoked\n", r.GetId())
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (at most 1 KiB)")
	outputFlag(cmd, &out)
	return cmd
}
