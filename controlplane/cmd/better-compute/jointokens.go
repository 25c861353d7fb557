package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// Limits of join-tokens create.
const (
	maxJoinTokenTTL  = 30 * 24 * time.Hour
	maxJoinTokenUses = 100000
)

// joinTokenJSON is a join token in -o json output. Token is set only by
// create without --out: the secret is shown once. NodeID is set on a token
// of nodes reinstall, bound to that node.
type joinTokenJSON struct {
	ID          string     `json:"id"`
	PoolID      string     `json:"poolId"`
	Description string     `json:"description,omitempty"`
	MaxUses     int        `json:"maxUses"`
	Uses        int        `json:"uses"`
	State       string     `json:"state"`
	ExpiresAt   time.Time  `json:"expiresAt"`
	RevokedAt   *time.Time `json:"revokedAt,omitempty"`
	CreatedAt   time.Time  `json:"createdAt"`
	NodeID      string     `json:"nodeId,omitempty"`
	Token       string     `json:"token,omitempty"`
	File        string     `json:"file,omitempty"`
}

// tokenState says whether a token can still admit a join.
func tokenState(t *store.JoinToken, now time.Time) string {
	switch {
	case t.RevokedAt != nil:
		return "revoked"
	case !t.ExpiresAt.After(now):
		return "expired"
	case t.Uses >= t.MaxUses:
		return "used up"
	}
	return "active"
}

func tokenOut(t *store.JoinToken, now time.Time) joinTokenJSON {
	j := joinTokenJSON{ID: t.ID, PoolID: t.PoolID, Description: t.Description, MaxUses: t.MaxUses, Uses: t.Uses,
		State: tokenState(t, now), ExpiresAt: t.ExpiresAt.UTC(), CreatedAt: t.CreatedAt.UTC(), NodeID: t.NodeID}
	if t.RevokedAt != nil {
		r := t.RevokedAt.UTC()
		j.RevokedAt = &r
	}
	return j
}

// joinTokensCmd groups the join token commands.
func joinTokensCmd(e *env) *cobra.Command {
	c := &cobra.Command{Use: "join-tokens", Short: "Create, list and revoke the tokens daemons join a pool with"}
	c.AddCommand(joinTokensCreateCmd(e), joinTokensListCmd(e), joinTokensRevokeCmd(e))
	return c
}

func joinTokensCreateCmd(e *env) *cobra.Command {
	var (
		pool, outFile, description, out string
		ttl                             time.Duration
		maxUses                         int
	)
	cmd := &cobra.Command{
		Use:   "create --pool P [--ttl 2h] [--max-uses 8] [--out FILE]",
		Short: "Create a join token for a pool; it is shown once (or written to FILE, mode 0600), only its hash is stored",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			switch {
			case pool == "":
				return usageError{errors.New("--pool is required")}
			case ttl <= 0 || ttl > maxJoinTokenTTL:
				return usageError{fmt.Errorf("--ttl %s: want more than 0 and at most %s", ttl, maxJoinTokenTTL)}
			case maxUses < 1 || maxUses > maxJoinTokenUses:
				return usageError{fmt.Errorf("--max-uses %d: want 1 to %d", maxUses, maxJoinTokenUses)}
			}
			if outFile != "" {
				// Check the folder first: a token whose file cannot be
				// written would be a live credential nobody holds.
				if fi, err := os.Stat(filepath.Dir(outFile)); err != nil || !fi.IsDir() {
					return usageError{fmt.Errorf("--out %s: the folder %s does not exist", outFile, filepath.Dir(outFile))}
				}
			}
			return e.withStore(cmd.Context(), func(cfg *config.Config, st store.Store) error {
				ctx := cmd.Context()
				p, err := st.PoolGet(ctx, pool)
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("no pool %s (see better-compute pools list)", pool)
				}
				if err != nil {
					return err
				}
				b, err := bundle(ctx, cfg, st)
				if err != nil {
					return err
				}
				secret, t, err := api.CreateJoinToken(ctx, st, b.GatewayPin(), p.ID, ttl, maxUses, description, "")
				if err != nil {
					return err
				}
				details, _ := json.Marshal(map[string]any{"poolId": p.ID, "maxUses": maxUses, "expiresAt": t.ExpiresAt.UTC()})
				if err := audit(ctx, st, "joinTokens.create", "join-token/"+t.ID, details); err != nil {
					return err
				}
				res := tokenOut(t, time.Now())
				if outFile != "" {
					if err := writeSecretFile(outFile, []byte(secret+"\n")); err != nil {
						// Nobody holds the secret: take the token back.
						if rerr := st.JoinTokenRevoke(ctx, t.ID); rerr != nil {
							return fmt.Errorf("write the token: %w (and revoking join token %s failed: %v; revoke it)", err, t.ID, rerr)
						}
						return fmt.Errorf("write the token: %w (join token %s revoked)", err, t.ID)
					}
					res.File = outFile
				} else {
					res.Token = secret
				}
				if out == "json" {
					return printValue(e.stdout, res)
				}
				if outFile != "" {
					fmt.Fprintf(e.stdout, "join token %s for pool %s written to %s (mode 0600); %d uses, expires %s\n",
						t.ID, p.Name, outFile, t.MaxUses, t.ExpiresAt.UTC().Format(time.RFC3339))
					return nil
				}
				fmt.Fprintln(e.stdout, secret)
				fmt.Fprintf(e.stderr, "join token %s for pool %s: %d uses, expires %s; it is shown only this once\n",
					t.ID, p.Name, t.MaxUses, t.ExpiresAt.UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&pool, "pool", "", "pool id or name (required)")
	fl.DurationVar(&ttl, "ttl", 2*time.Hour, "how long the token admits joins")
	fl.IntVar(&maxUses, "max-uses", 8, "how many joins the token admits")
	fl.StringVar(&outFile, "out", "", "write the token to this file (mode 0600) instead of printing it")
	fl.StringVar(&description, "description", "", "what the token is for")
	outputFlag(cmd, &out)
	return cmd
}

func joinTokensListCmd(e *env) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List join tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			return e.withStore(cmd.Context(), func(_ *config.Config, st store.Store) error {
				tokens, err := listAll(cmd.Context(), st.JoinTokenList, func(t *store.JoinToken) string { return t.ID })
				if err != nil {
					return err
				}
				now := time.Now()
				if out == "json" {
					res := make([]joinTokenJSON, 0, len(tokens))
					for _, t := range tokens {
						res = append(res, tokenOut(t, now))
					}
					return printValue(e.stdout, res)
				}
				rows := make([][]string, 0, len(tokens))
				for _, t := range tokens {
					rows = append(rows, []string{t.ID, t.PoolID, strconv.Itoa(t.Uses) + "/" + strconv.Itoa(t.MaxUses),
						tokenState(t, now), timeCell(&t.ExpiresAt), t.Description})
				}
				return table(e.stdout, []string{"ID", "POOL", "USES", "STATE", "EXPIRES", "DESCRIPTION"}, rows)
			})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

func joinTokensRevokeCmd(e *env) *cobra.Command {
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
			return e.withStore(cmd.Context(), func(_ *config.Config, st store.Store) error {
				ctx := cmd.Context()
				err := st.JoinTokenRevoke(ctx, id)
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("no join token %s", id)
				}
				if err != nil {
					return err
				}
				if err := audit(ctx, st, "joinTokens.revoke", "join-token/"+id, nil); err != nil {
					return err
				}
				t, err := st.JoinTokenGet(ctx, id)
				if err != nil {
					return err
				}
				if out == "json" {
					return printValue(e.stdout, tokenOut(t, time.Now()))
				}
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
