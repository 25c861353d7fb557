package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// completionTimeout bounds the API calls of one completion: a shell waits
// for it on every TAB.
const completionTimeout = 5 * time.Second

// completionMax is the most node ids or pool names one completion lists
// (pages of nodes.list and pools.list).
const completionMax = 5000

// addCompletions makes the shell completion of cobra's completion command
// (bash, zsh, fish, powershell) offer values from the API: node ids for
// every --node flag and for a first positional argument named NODE_ID in
// the command's usage, pool names for every --pool flag and site names for
// every --site flag. The values come from the server and token the command
// line names (--server, --token, --ca-file, --data-dir, --config, as the
// command itself would resolve them); when the API cannot be reached the
// completion offers nothing, quietly.
func addCompletions(root *cobra.Command, e *env) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		for flag, list := range map[string]func(context.Context, *client.Client) ([]cobra.Completion, error){
			"node": nodeCompletions, "pool": poolCompletions, "site": siteCompletions,
		} {
			if c.LocalFlags().Lookup(flag) != nil {
				_ = c.RegisterFlagCompletionFunc(flag, e.completeFrom(list))
			}
		}
		if fields := strings.Fields(c.Use); len(fields) > 1 && fields[1] == "NODE_ID" && c.ValidArgsFunction == nil {
			complete := e.completeFrom(nodeCompletions)
			c.ValidArgsFunction = func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
				if len(args) > 0 {
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				return complete(c, args, toComplete)
			}
		}
	}
	walk(root)
}

// completeFrom is a completion function offering list's values that start
// with what is typed, from the API the command line names.
func (e *env) completeFrom(list func(context.Context, *client.Client) ([]cobra.Completion, error)) cobra.CompletionFunc {
	return func(c *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		values, err := e.completionValues(c, list)
		if err != nil {
			cobra.CompDebugln(fmt.Sprintf("completion from the API: %v", err), true)
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, v := range values {
			if strings.HasPrefix(v, toComplete) {
				out = append(out, v)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// completionValues calls list with the client of c's command line.
func (e *env) completionValues(c *cobra.Command, list func(context.Context, *client.Client) ([]cobra.Completion, error)) ([]cobra.Completion, error) {
	var f apiFlags
	for name, v := range map[string]*string{"server": &f.server, "token": &f.token, "ca-file": &f.caFile} {
		if fl := c.Flags().Lookup(name); fl != nil {
			*v = fl.Value.String()
		}
	}
	cl, err := e.client(&f)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(cmdContext(c), completionTimeout)
	defer cancel()
	return list(ctx, cl)
}

// cmdContext is c's context, or a background one when it has none.
func cmdContext(c *cobra.Command) context.Context {
	if ctx := c.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// nodeCompletions lists node ids, each described by its hostname, pool and
// state.
func nodeCompletions(ctx context.Context, cl *client.Client) ([]cobra.Completion, error) {
	nodes, _, err := listPages(ctx, completionMax, 1000, cl.NodesList,
		func(p *apiv1.Page) *apiv1.ListNodesRequest { return &apiv1.ListNodesRequest{Page: p} },
		(*apiv1.ListNodesResponse).GetNodes)
	out := make([]cobra.Completion, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, cobra.CompletionWithDesc(n.GetId(), n.GetHostname()+" ("+n.GetState()+")"))
	}
	return out, err
}

// poolCompletions lists pool names.
func poolCompletions(ctx context.Context, cl *client.Client) ([]cobra.Completion, error) {
	pools, _, err := listPages(ctx, completionMax, 1000, cl.PoolsList,
		func(p *apiv1.Page) *apiv1.ListPoolsRequest { return &apiv1.ListPoolsRequest{Page: p} },
		(*apiv1.ListPoolsResponse).GetPools)
	out := make([]cobra.Completion, 0, len(pools))
	for _, p := range pools {
		out = append(out, p.GetName())
	}
	return out, err
}

// siteCompletions lists site names, each described by its region.
func siteCompletions(ctx context.Context, cl *client.Client) ([]cobra.Completion, error) {
	sites, _, err := listPages(ctx, completionMax, 1000, cl.SitesList,
		func(p *apiv1.Page) *apiv1.ListSitesRequest { return &apiv1.ListSitesRequest{Page: p} },
		(*apiv1.ListSitesResponse).GetSites)
	out := make([]cobra.Completion, 0, len(sites))
	for _, s := range sites {
		out = append(out, cobra.CompletionWithDesc(s.GetName(), s.GetRegion()))
	}
	return out, err
}
