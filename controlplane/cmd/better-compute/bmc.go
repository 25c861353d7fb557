package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// maxPasswordFile bounds what --password-file reads.
const maxPasswordFile = 4096

func bmcCmd(e *env) *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "bmc",
		Short: "Power machines on and off and set their boot device through their BMC",
		Long: `The bmc commands create power.* and boot.set commands for a node and wait for
their results. Without --bmc they drive the node's own BMC (the credentials
set with "bmc credentials set", else the bmc entry of the node's
/etc/bcd/bmc.yaml); with --bmc NAME, the BMC of that name in the node's
/etc/bcd/bmc.yaml list (a site agent powering machines that run no daemon).`,
	}
	af.add(cmd)
	for _, a := range []struct{ action, short string }{
		{"status", "Print the machine's power state"},
		{"on", "Power the machine on"},
		{"off", "Power the machine off at once (hard)"},
		{"soft-off", "Ask the operating system to shut down (ACPI)"},
		{"cycle", "Power the machine off, then on"},
		{"reset", "Reset the machine (hard)"},
	} {
		cmd.AddCommand(bmcPowerCmd(e, &af, a.action, a.short))
	}
	cmd.AddCommand(bmcBootCmd(e, &af), bmcCredentialsCmd(e, &af))
	return cmd
}

// bmcTarget are the flags that say which BMC.
type bmcTarget struct {
	nodes   []string
	bmc     string
	timeout time.Duration
	out     string
}

func (t *bmcTarget) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVar(&t.nodes, "node", nil, "node id (repeatable): its own BMC, or with --bmc the agent that reaches the named BMC")
	fl.StringVar(&t.bmc, "bmc", "", "name of a BMC in the node's /etc/bcd/bmc.yaml list (bmcs)")
	fl.DurationVar(&t.timeout, "timeout", 0, "deadline from creation to result (default 10m)")
	outputFlag(cmd, &t.out)
}

func (t *bmcTarget) check() error {
	if err := checkOutput(t.out); err != nil {
		return err
	}
	if len(t.nodes) == 0 {
		return usageError{errors.New("give --node (the node whose BMC, or the site agent that reaches --bmc)")}
	}
	return nil
}

func bmcPowerCmd(e *env, af *apiFlags, action, short string) *cobra.Command {
	var t bmcTarget
	cmd := &cobra.Command{
		Use:   action + " --node N [--bmc NAME]",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := t.check(); err != nil {
				return err
			}
			req := &apiv1.CreateCommandsRequest{NodeIds: t.nodes, Kind: "power." + action, Power: &apiv1.PowerSpec{Bmc: t.bmc}}
			return runBMC(cmd.Context(), e, af, &t, req)
		},
	}
	t.add(cmd)
	return cmd
}

func bmcBootCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		t          bmcTarget
		device     string
		persistent bool
	)
	cmd := &cobra.Command{
		Use:   "boot --node N [--bmc NAME] --device pxe|disk|bios|cdrom [--persistent]",
		Short: "Set the device the machine boots from next (or always, with --persistent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := t.check(); err != nil {
				return err
			}
			switch device {
			case "pxe", "disk", "bios", "cdrom":
			default:
				return usageError{fmt.Errorf("--device %q: want pxe, disk, bios or cdrom", device)}
			}
			req := &apiv1.CreateCommandsRequest{NodeIds: t.nodes, Kind: sessionv1.KindBootSet,
				Boot: &apiv1.BootSpec{Bmc: t.bmc, Device: device, Persistent: persistent}}
			return runBMC(cmd.Context(), e, af, &t, req)
		},
	}
	t.add(cmd)
	cmd.Flags().StringVar(&device, "device", "pxe", "boot device: pxe, disk, bios or cdrom")
	cmd.Flags().BoolVar(&persistent, "persistent", false, "keep the device for every later boot, not only the next one")
	return cmd
}

// runBMC creates the commands, waits for their results and prints them.
func runBMC(ctx context.Context, e *env, af *apiFlags, t *bmcTarget, req *apiv1.CreateCommandsRequest) error {
	if t.timeout > 0 {
		req.Timeout = durationpb.New(t.timeout)
	}
	return e.startCommands(ctx, af, t.out, false, req, func(c *client.Client, cmds []*apiv1.Command) error {
		done, err := awaitCommands(ctx, c, cmds, e.stderr, false, nil)
		if err != nil {
			return err
		}
		if t.out == "json" {
			if err := printJSON(e.stdout, &apiv1.ListCommandsResponse{Commands: done}); err != nil {
				return err
			}
		} else {
			if err := tableOf(e.stdout, []string{"NODE", "BMC", "ACTION", "STATE", "POWER", "DETAIL"}, done, bmcRow); err != nil {
				return err
			}
		}
		failed := 0
		for _, x := range done {
			if x.State != "succeeded" {
				failed++
			}
		}
		if failed > 0 {
			return commandFailedError{failed}
		}
		return nil
	})
}

// bmcRow is one command's line of the table.
func bmcRow(x *apiv1.Command) []string {
	res := x.GetResult().AsMap()
	str := func(k string) string { s, _ := res[k].(string); return s }
	bmc := str("bmc")
	if n := str("name"); n != "" {
		bmc = n + " (" + bmc + ")"
	}
	action := strings.TrimPrefix(strings.TrimPrefix(x.Kind, "power."), "boot.")
	detail := x.Error
	if x.State == "succeeded" {
		switch {
		case x.Kind == sessionv1.KindBootSet:
			detail = "next boot from " + str("device")
			if p, _ := res["persistent"].(bool); p {
				detail = "always boot from " + str("device")
			}
		case str("answer") != "":
			detail = str("answer")
		}
		if p := str("provider"); p != "" {
			detail = strings.TrimSpace(detail + " (" + p + ")")
		}
	}
	return []string{x.NodeId, orDash(bmc), action, x.State, orDash(str("power")), orDash(detail)}
}

func bmcCredentialsCmd(e *env, af *apiFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "credentials", Short: "Store or remove a node's BMC credentials, sealed for that node"}
	cmd.AddCommand(bmcCredentialsSetCmd(e, af), bmcCredentialsDeleteCmd(e, af))
	return cmd
}

func bmcCredentialsSetCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		node, address, username, passwordFile, cipherSuite, out string
		providers                                               []string
		ipmiPort, redfishPort                                   uint32
		timeout                                                 time.Duration
	)
	cmd := &cobra.Command{
		Use:   "set --node N --address A --username U --password-file F",
		Short: "Seal a node's own BMC credentials for it (admin)",
		Long: `Set stores the credentials of a node's own BMC in the control plane, sealed
under the deployment secret as the secret bmc/<node id>, which only that node
can fetch (over its mutual-TLS session). The password is read from
--password-file (- for standard input; one line, a trailing newline is
dropped) and is never printed, logged or put in the audit log.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if node == "" || address == "" || username == "" || passwordFile == "" {
				return usageError{errors.New("give --node, --address, --username and --password-file")}
			}
			password, err := readPassword(cmd.InOrStdin(), passwordFile)
			if err != nil {
				return err
			}
			req := &apiv1.SetBMCCredentialsRequest{NodeId: node, Address: address, Username: username, Password: password,
				Providers: providers, IpmiPort: ipmiPort, RedfishPort: redfishPort, IpmiCipherSuite: cipherSuite}
			if timeout > 0 {
				req.Timeout = durationpb.New(timeout)
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.SetBMCCredentialsResponse, error) {
					return c.BmcSetCredentials(ctx, req)
				},
				func(_ *client.Client, resp *apiv1.SetBMCCredentialsResponse) error {
					fmt.Fprintf(e.stdout, "Sealed the BMC credentials of node %s (%s@%s) as secret %s\n", resp.NodeId, resp.Username, resp.Address, resp.SecretName)
					return nil
				})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&node, "node", "", "node id (required)")
	fl.StringVar(&address, "address", "", "BMC host name or IP address, without port (required)")
	fl.StringVar(&username, "username", "", "BMC user name (required)")
	fl.StringVar(&passwordFile, "password-file", "", "file holding the BMC password, - for standard input (required)")
	fl.StringSliceVar(&providers, "providers", nil, "providers in the order to try: ipmitool, redfish (default both)")
	fl.Uint32Var(&ipmiPort, "ipmi-port", 0, "UDP port of IPMI over LAN (default 623)")
	fl.Uint32Var(&redfishPort, "redfish-port", 0, "HTTPS port of Redfish (default 443)")
	fl.StringVar(&cipherSuite, "ipmi-cipher-suite", "", "ipmitool -C (default 3)")
	fl.DurationVar(&timeout, "bmc-timeout", 0, "time limit of each BMC call (default 30s)")
	outputFlag(cmd, &out)
	return cmd
}

func bmcCredentialsDeleteCmd(e *env, af *apiFlags) *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:   "delete --node N",
		Short: "Remove a node's sealed BMC credentials (admin)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return usageError{errors.New("give --node")}
			}
			return runAPI(cmd.Context(), e, af, "table", // no -o: always this line
				func(ctx context.Context, c *client.Client) (*apiv1.DeleteBMCCredentialsResponse, error) {
					return c.BmcDeleteCredentials(ctx, &apiv1.DeleteBMCCredentialsRequest{NodeId: node})
				},
				func(*client.Client, *apiv1.DeleteBMCCredentialsResponse) error {
					fmt.Fprintf(e.stdout, "Removed the BMC credentials of node %s\n", node)
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "node id (required)")
	return cmd
}

// readPassword reads a one-line password from path ("-": stdin). Its
// errors never quote the file's content.
func readPassword(stdin io.Reader, path string) (string, error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return "", usageError{fmt.Errorf("--password-file: %w", err)}
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxPasswordFile+1))
	if err != nil {
		return "", fmt.Errorf("--password-file: %w", err)
	}
	if len(b) > maxPasswordFile {
		return "", usageError{fmt.Errorf("--password-file %s: over %d bytes; it must hold the password alone", path, maxPasswordFile)}
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", usageError{fmt.Errorf("--password-file %s is empty", path)}
	}
	if strings.ContainsAny(s, "\r\n") {
		return "", usageError{fmt.Errorf("--password-file %s holds more than one line; it must hold the password alone", path)}
	}
	return s, nil
}
