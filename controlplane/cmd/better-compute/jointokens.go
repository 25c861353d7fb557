package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// joinTokensCmd groups the join token commands; they call
// joinTokens.create, joinTokens.list and joinTokens.revoke.
func joinTokensCmd(e *env) *cobra.Command {
	return apiGroup(e, "join-tokens", "Create, list and revoke the tokens daemons join a pool with",
		joinTokensCreateCmd, joinTokensListCmd, joinTokensRevokeCmd)
}

func joinTokensCreateCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		pool, outFile, description, out string
		ttl                             time.Duration
		maxUses                         int
	)
	cmd := &cobra.Command{
		Use:   "create --pool P [--ttl 2h] [--max-uses 8] [--out FILE]",
		Short: "Create a join token for a pool; it is shown once (or written to FILE, mode 0600), only its hash is stored",
		Long: `create calls joinTokens.create. -o json prints its answer: the join token and,
without --out, the token string itself (shown this once); with --out the
token is written to FILE (mode 0600) and left out of the answer.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			switch {
			case pool == "":
				return usageError{errors.New("--pool is required")}
			case ttl < apiv1.MinJoinTokenTTL || ttl > apiv1.MaxJoinTokenTTL:
				return usageError{fmt.Errorf("--ttl %s: want %s to %s", ttl, apiv1.MinJoinTokenTTL, apiv1.MaxJoinTokenTTL)}
			case maxUses < 1 || maxUses > apiv1.MaxJoinTokenUses:
				return usageError{fmt.Errorf("--max-uses %d: want 1 to %d", maxUses, apiv1.MaxJoinTokenUses)}
			}
			if err := checkOutFolder(outFile); err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.CreateJoinTokenResponse, error) {
					req := &apiv1.CreateJoinTokenRequest{Pool: pool, Ttl: durationpb.New(ttl), MaxUses: int32(maxUses), Description: description}
					res, err := c.JoinTokensCreate(ctx, req)
					if err != nil || outFile == "" {
						return res, err
					}
					if err := writeTokenFile(ctx, c, outFile, res.Token, res.JoinToken.Id); err != nil {
						return nil, err
					}
					res.Token = ""
					return res, nil
				},
				func(_ *client.Client, res *apiv1.CreateJoinTokenResponse) error {
					t := res.JoinToken
					if outFile != "" {
						fmt.Fprintf(e.stdout, "join token %s for pool %s written to %s (mode 0600); %d uses, expires %s\n",
							t.Id, pool, outFile, t.MaxUses, when(t.ExpireTime))
						return nil
					}
					fmt.Fprintln(e.stdout, res.Token)
					fmt.Fprintf(e.stderr, "join token %s for pool %s: %d uses, expires %s; it is shown only this once\n",
						t.Id, pool, t.MaxUses, when(t.ExpireTime))
					return nil
				})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&pool, "pool", "", "pool id or name (required)")
	fl.DurationVar(&ttl, "ttl", apiv1.DefaultJoinTokenTTL, "how long the token admits joins")
	fl.IntVar(&maxUses, "max-uses", 8, "how many joins the token admits")
	fl.StringVar(&outFile, "out", "", "write the token to this file (mode 0600) instead of printing it")
	fl.StringVar(&description, "description", "", "what the token is for")
	outputFlag(cmd, &out)
	return cmd
}

func joinTokensListCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List join tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListJoinTokensResponse, error) {
					tokens, err := listAll(ctx, c.JoinTokensList,
						func(p *apiv1.Page) *apiv1.ListJoinTokensRequest { return &apiv1.ListJoinTokensRequest{Page: p} },
						(*apiv1.ListJoinTokensResponse).GetJoinTokens)
					return &apiv1.ListJoinTokensResponse{JoinTokens: tokens}, err
				},
				func(_ *client.Client, r *apiv1.ListJoinTokensResponse) error {
					return tableOf(e.stdout, []string{"ID", "POOL", "USES", "STATE", "EXPIRES", "DESCRIPTION"}, r.JoinTokens,
						func(t *apiv1.JoinToken) []string {
							return []string{t.Id, t.PoolId, strconv.Itoa(int(t.Uses)) + "/" + strconv.Itoa(int(t.MaxUses)),
								t.State, when(t.ExpireTime), t.Description}
						})
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

func joinTokensRevokeCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a join token: it admits no further joins (nodes that joined stay)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			id, err := joinTokenID(args[0])
			if err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.RevokeJoinTokenResponse, error) {
					return c.JoinTokensRevoke(ctx, &apiv1.RevokeJoinTokenRequest{Id: id})
				},
				func(*client.Client, *apiv1.RevokeJoinTokenResponse) error {
					fmt.Fprintf(e.stdout, "revoked join token %s\n", id)
					return nil
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

// joinTokenID is the id arg names: a token id (jt_...), or a whole token
// (bct1.<id>.<secret>.<pin>), of which only the id is used. An error never
// repeats arg, which may hold a secret.
func joinTokenID(arg string) (string, error) {
	if !strings.Contains(arg, ".") {
		return arg, nil
	}
	tok, err := jointoken.Parse(arg)
	if err != nil {
		return "", usageError{err: errors.New("not a join token id (jt_...) nor a whole join token; the argument is not repeated here, as it may hold a secret")}
	}
	return tok.ID(), nil
}

// checkOutFolder checks that the folder of --out (outFile; "" when not
// given) exists before a token is made: a token whose file cannot be
// written would be a live credential nobody holds. Its error is a usage
// error.
func checkOutFolder(outFile string) error {
	if outFile == "" {
		return nil
	}
	if fi, err := os.Stat(filepath.Dir(outFile)); err != nil || !fi.IsDir() {
		return usageError{fmt.Errorf("--out %s: the folder %s does not exist", outFile, filepath.Dir(outFile))}
	}
	return nil
}

// writeTokenFile writes the secret token (of the join token id) to
// outFile, mode 0600. When that fails nobody holds the secret, so the
// token is revoked (joinTokens.revoke); the error says whether that
// worked.
func writeTokenFile(ctx context.Context, c *client.Client, outFile, token, id string) error {
	err := writeSecretFile(outFile, []byte(token+"\n"))
	if err == nil {
		return nil
	}
	if _, rerr := c.JoinTokensRevoke(ctx, &apiv1.RevokeJoinTokenRequest{Id: id}); rerr != nil {
		return fmt.Errorf("write the token: %w (and revoking join token %s failed: %v; revoke it)", err, id, rerr)
	}
	return fmt.Errorf("write the token: %w (join token %s revoked)", err, id)
}
