package api

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/proto/bmcsecret"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// isPowerKind reports whether kind is one of the power.* kinds.
func isPowerKind(kind string) bool {
	_, ok := sessionv1.PowerAction(kind)
	return ok
}

// bmcCommandSpec validates the spec of a power.* or boot.set request and
// returns it in the session-protocol form: a PowerSpec whose action is the
// kind's suffix, or a BootSpec.
func bmcCommandSpec(r *apiv1.CreateCommandsRequest) (*sessionv1.Command, error) {
	if r.Exec != nil {
		return nil, invalid("exec", "only for kind exec")
	}
	if r.GetKind() == sessionv1.KindBootSet {
		if r.Power != nil {
			return nil, invalid("power", "only for the power.* kinds")
		}
		b := r.GetBoot()
		if b == nil {
			return nil, invalid("boot", "is required for kind boot.set (device)")
		}
		switch b.GetDevice() {
		case "pxe", "disk", "bios", "cdrom":
		case "":
			return nil, invalid("boot.device", "is required: pxe, disk, bios or cdrom")
		default:
			return nil, invalid("boot.device", "unknown device %q: want pxe, disk, bios or cdrom", b.GetDevice())
		}
		if err := bmcName("boot.bmc", b.GetBmc()); err != nil {
			return nil, err
		}
		return &sessionv1.Command{Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{Bmc: b.GetBmc(), Device: b.GetDevice(),
			Persistent: b.GetPersistent()}}}, nil
	}
	if r.Boot != nil {
		return nil, invalid("boot", "only for kind boot.set")
	}
	p := r.GetPower()
	if p == nil {
		p = &apiv1.PowerSpec{}
	}
	if err := bmcName("power.bmc", p.GetBmc()); err != nil {
		return nil, err
	}
	action, _ := sessionv1.PowerAction(r.GetKind())
	return &sessionv1.Command{Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Bmc: p.GetBmc(), Action: action}}}, nil
}

// bmcName checks a BMC name: empty (the node's own) or 1 to 63 of A-Z,
// a-z, 0-9, '.', '-', '_' (bcd/bmc's rule for names in the BMC file).
func bmcName(field, v string) error {
	if v == "" {
		return nil
	}
	if len(v) > 63 {
		return invalid(field, "at most 63 characters")
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return invalid(field, "may hold only A-Z, a-z, 0-9, '.', '-' and '_'")
		}
	}
	return nil
}

// resultOut fills a command's structured result for commandOut.
func resultOut(out *apiv1.Command, c *store.Command) {
	if len(c.Result) > 0 {
		res := &structpb.Struct{}
		if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(c.Result, res) == nil {
			out.Result = res
		}
	}
}

// bmcSetCredentials seals a node's own BMC credentials for it.
func (s *Server) bmcSetCredentials(ctx context.Context, _ *iam.Principal, r *apiv1.SetBMCCredentialsRequest) (*apiv1.SetBMCCredentialsResponse, error) {
	if err := id("nodeId", r.GetNodeId()); err != nil {
		return nil, err
	}
	creds := &bmcsecret.Credentials{Address: r.GetAddress(), Username: r.GetUsername(), Password: r.GetPassword(),
		Providers: r.GetProviders(), IPMIPort: r.GetIpmiPort(), RedfishPort: r.GetRedfishPort(), IPMICipherSuite: r.GetIpmiCipherSuite()}
	if t := r.GetTimeout(); t != nil {
		if err := t.CheckValid(); err != nil || t.AsDuration() <= 0 || t.AsDuration() > bmcsecret.MaxTimeout {
			return nil, invalid("timeout", "must be above 0 and at most %v", bmcsecret.MaxTimeout)
		}
		creds.Timeout = t.AsDuration().String()
	}
	if err := creds.Validate(); err != nil {
		// The message names the field, never its value.
		msg := strings.TrimPrefix(err.Error(), bmcsecret.ErrInvalid.Error()+": ")
		field, _, _ := strings.Cut(msg, ":")
		if field == "ports are 1 to 65535" {
			field = "ipmiPort"
		}
		return nil, invalid(field, "%s", msg)
	}
	if s.cfg.Secret == "" {
		return nil, &Error{Code: apiv1.CodeUnavailable, Message: "this API process has no deployment secret to seal credentials with"}
	}
	if _, err := s.store.NodeGet(ctx, r.GetNodeId()); err != nil {
		return nil, fieldNotFound(err, "nodeId", "no node "+r.GetNodeId())
	}
	value, err := creds.Marshal()
	if err != nil {
		return nil, err
	}
	name := bmcsecret.Name(r.GetNodeId())
	sealed, err := pki.Seal(s.cfg.Secret, value, pki.SecretAAD(name))
	clear(value)
	if err != nil {
		return nil, err
	}
	if err := s.store.SecretPut(ctx, &store.Secret{Name: name, NodeID: r.GetNodeId(), Sealed: sealed}); err != nil {
		return nil, err
	}
	return &apiv1.SetBMCCredentialsResponse{NodeId: r.GetNodeId(), SecretName: name, Address: creds.Address,
		Username: creds.Username, UpdateTime: timestamppb.New(time.Now())}, nil
}

// bmcDeleteCredentials forgets a node's sealed BMC credentials.
func (s *Server) bmcDeleteCredentials(ctx context.Context, _ *iam.Principal, r *apiv1.DeleteBMCCredentialsRequest) (*apiv1.DeleteBMCCredentialsResponse, error) {
	if err := id("nodeId", r.GetNodeId()); err != nil {
		return nil, err
	}
	name := bmcsecret.Name(r.GetNodeId())
	if _, err := s.store.SecretGet(ctx, name); err != nil {
		return nil, fieldNotFound(err, "nodeId", "no BMC credentials for node "+r.GetNodeId())
	}
	if err := s.store.SecretDelete(ctx, name); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	return &apiv1.DeleteBMCCredentialsResponse{}, nil
}

// withoutSecrets returns req with every string field named password
// cleared (in a copy), so that the audit log's request digest cannot serve
// to test guesses of a password.
func withoutSecrets(req proto.Message) proto.Message {
	fields := req.ProtoReflect().Descriptor().Fields()
	f := fields.ByName("password")
	if f == nil || f.Kind() != protoreflect.StringKind {
		return req
	}
	out := proto.Clone(req)
	out.ProtoReflect().Clear(f)
	return out
}
