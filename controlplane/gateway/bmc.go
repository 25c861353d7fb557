package gateway

import (
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// bmcSpec sets the spec of the BMC kinds: power.<action> carries a
// PowerSpec whose action is the kind's suffix, boot.set a BootSpec. The
// stored spec is the API's PowerSpec or BootSpec as JSON. Other kinds are
// left alone.
func bmcSpec(cmd *sessionv1.Command, c *store.Command) error {
	unmarshal := protojson.UnmarshalOptions{DiscardUnknown: true}
	switch action, power := strings.CutPrefix(c.Kind, "power."); {
	case power:
		spec := &apiv1.PowerSpec{}
		if len(c.Spec) > 0 {
			if err := unmarshal.Unmarshal(c.Spec, spec); err != nil {
				return err
			}
		}
		cmd.Spec = &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Bmc: spec.GetBmc(), Action: action}}
	case c.Kind == "boot.set":
		spec := &apiv1.BootSpec{}
		if len(c.Spec) > 0 {
			if err := unmarshal.Unmarshal(c.Spec, spec); err != nil {
				return err
			}
		}
		cmd.Spec = &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{Bmc: spec.GetBmc(), Device: spec.GetDevice(), Persistent: spec.GetPersistent()}}
	}
	return nil
}
