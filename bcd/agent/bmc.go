package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/bcd/bmc"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/proto/bmcsecret"
)

// secretTimeout bounds fetching the node's sealed BMC credentials.
const secretTimeout = 10 * time.Second

// ReasonSecretUnavailable is bmc.Result.Reason when the node's sealed BMC
// credentials could not be fetched from the gateway.
const ReasonSecretUnavailable = "SECRET_UNAVAILABLE"

// BMCConfig configures the BMC commands (power.*, boot.set). An
// unprivileged node sends them to the root helper, which reads its own BMC
// file and runs the plugins; a node that runs as root carries them out
// itself with these settings.
type BMCConfig struct {
	// NodeID names the node's sealed credentials, the secret bmc/<NodeID>.
	// Defaults to the node id in the certificate's SPIFFE ID.
	NodeID string
	// File is the BMC file (see bcd/bmc) of a node that runs as root.
	// Defaults to bmc.DefaultFile (/etc/bcd/bmc.yaml).
	File string
	// PluginDir is the plugin directory of a node that runs as root.
	// Defaults to /usr/lib/bcd/plugins.
	PluginDir string
}

// bmcRunner is the executor's BMC: it adds the node's sealed credentials to
// calls on the node's own BMC and passes the call to the root helper, or to
// a controller in this process.
type bmcRunner struct {
	a      *Agent
	nodeID string
	helper *helper.Client  // unprivileged
	local  *bmc.Controller // root
}

// newBMC makes the agent's BMC runner.
func (a *Agent) newBMC() *bmcRunner {
	r := &bmcRunner{a: a, nodeID: cmp.Or(a.cfg.BMC.NodeID, nodeIDOf(a.cfg.Session))}
	if a.cfg.Unprivileged {
		r.helper = &helper.Client{Socket: a.cfg.HelperSocket}
	} else {
		r.local = bmc.New(bmc.Config{File: a.cfg.BMC.File, PluginDir: a.cfg.BMC.PluginDir, Logger: a.log})
	}
	a.bmc = r
	return r
}

// closeBMC stops the plugins this process started.
func (a *Agent) closeBMC() {
	if a.bmc != nil && a.bmc.local != nil {
		a.bmc.local.Close()
	}
}

// Do carries out req.
func (r *bmcRunner) Do(ctx context.Context, req *bmc.Request) (*bmc.Result, error) {
	if req.BMC == "" && req.Credentials == nil {
		id := cmp.Or(req.NodeID, r.nodeID)
		creds, err := r.sealed(ctx, id)
		if err != nil {
			return &bmc.Result{Action: req.Action, NodeID: req.NodeID, Reason: ReasonSecretUnavailable}, err
		}
		if creds == nil && req.NodeID != "" {
			return &bmc.Result{Action: req.Action, NodeID: req.NodeID, Reason: ReasonSecretUnavailable},
				fmt.Errorf("node %s's BMC: no sealed credentials granted to this node", req.NodeID)
		}
		req.Credentials = creds
	}
	res, err := r.do(ctx, req)
	if res != nil {
		res.NodeID = req.NodeID
	}
	return res, err
}

// do carries out req through the helper or this process's plugins.
func (r *bmcRunner) do(ctx context.Context, req *bmc.Request) (*bmc.Result, error) {
	if r.helper != nil {
		res, err := r.helper.BMC(ctx, req)
		if errors.Is(err, helper.ErrUnavailable) {
			return &bmc.Result{Action: req.Action, Name: req.BMC, Reason: bmc.ReasonPluginUnavailable}, err
		}
		return res, err
	}
	return r.local.Do(ctx, req)
}

// sealed fetches the BMC credentials of node nodeID (this node's own, or
// another's granted to it for one command) from the gateway; nil when the
// control plane holds none for it.
func (r *bmcRunner) sealed(ctx context.Context, nodeID string) (*bmcsecret.Credentials, error) {
	c := r.a.client.Load()
	if c == nil || nodeID == "" {
		return nil, nil
	}
	name := bmcsecret.Name(nodeID)
	sctx, cancel := context.WithTimeout(ctx, secretTimeout)
	defer cancel()
	value, err := c.Secret(sctx, name)
	switch {
	case errors.Is(err, session.ErrSecretNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("the node's own BMC: fetch its sealed credentials: %w", err)
	}
	creds, err := bmcsecret.Parse(value)
	if err != nil {
		return nil, fmt.Errorf("the node's own BMC: the sealed credentials %s: %w", name, err)
	}
	r.a.log.DebugContext(ctx, "Fetched the node's sealed BMC credentials", "secret", name, "bmc", creds.Address)
	return creds, nil
}

// nodeIDOf reads the node id from the SPIFFE ID of the node's certificate
// (spiffe://<trust domain>/node/<node id>).
func nodeIDOf(cfg session.Config) string {
	if len(cfg.Chain) == 0 {
		return ""
	}
	for _, u := range cfg.Chain[0].URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		if id, ok := strings.CutPrefix(u.Path, "/node/"); ok && id != "" && !strings.Contains(id, "/") {
			return id
		}
	}
	return ""
}
