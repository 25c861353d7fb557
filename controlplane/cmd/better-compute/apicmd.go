package main

import (
	"context"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// The shape every API command shares: -o checked, the client made, one
// call through the generated client (controlplane/pkg/client/methods.bcapi.go),
// and the answer printed as the API's own message (-o json) or drawn for
// people. Each command keeps only its request, its table and its flags.

// apiGroup is a command that groups API commands: use and short as
// cobra's, the --server, --token and --ca-file flags (apiFlags) that its
// commands share, and the commands that subs make with them.
func apiGroup(e *env, use, short string, subs ...func(*env, *apiFlags) *cobra.Command) *cobra.Command {
	af := &apiFlags{}
	c := &cobra.Command{Use: use, Short: short}
	af.add(c)
	for _, sub := range subs {
		c.AddCommand(sub(e, af))
	}
	return c
}

// runAPI runs an API command once its own flags are checked: it checks -o
// (out; a command that checks other flags checks -o first, as here, so a bad
// -o is the error named), makes the client of af (e.client), and calls call
// with it. With -o json it prints call's answer with printJSON; else render
// draws it for people, with the client for any further call (such as site
// names). A command without -o passes "table". Errors are -o's (a usage
// error), the client's and call's, returned as they are.
func runAPI[M proto.Message](ctx context.Context, e *env, af *apiFlags, out string,
	call func(context.Context, *client.Client) (M, error), render func(*client.Client, M) error) error {
	if err := checkOutput(out); err != nil {
		return err
	}
	c, err := e.client(af)
	if err != nil {
		return err
	}
	m, err := call(ctx, c)
	if err != nil {
		return err
	}
	if out == "json" {
		return printJSON(e.stdout, m)
	}
	return render(c, m)
}

// listPage is a page of a list method's answer: NextCursor is the cursor
// of the next page, "" on the last.
type listPage interface{ GetNextCursor() string }

// listAll calls list (a method of the generated client, such as
// c.SitesList) page after page, from the first, with the request req makes
// for each page (its cursor set), and returns the items that items picks
// from every page. The first error ends it.
func listAll[Req any, Resp listPage, T any](ctx context.Context, list func(context.Context, Req) (Resp, error),
	req func(*apiv1.Page) Req, items func(Resp) []T) ([]T, error) {
	all, _, err := listPages(ctx, 0, 0, list, req, items)
	return all, err
}

// listPages is listAll in pages of pageSize items (0: the API's default)
// up to limit items (0: all): with a limit no page asks for more than are
// still wanted. It returns the items and the cursor after the last one
// ("" when no more match).
func listPages[Req any, Resp listPage, T any](ctx context.Context, limit int, pageSize int32,
	list func(context.Context, Req) (Resp, error), req func(*apiv1.Page) Req, items func(Resp) []T) ([]T, string, error) {
	var all []T
	cursor := ""
	for {
		size := pageSize
		if left := limit - len(all); limit > 0 && (size == 0 || left < int(size)) {
			size = int32(left)
		}
		r, err := list(ctx, req(&apiv1.Page{Cursor: cursor, Limit: size}))
		if err != nil {
			return nil, "", err
		}
		all = append(all, items(r)...)
		if cursor = r.GetNextCursor(); cursor == "" || (limit > 0 && len(all) >= limit) {
			return all, cursor, nil
		}
	}
}
