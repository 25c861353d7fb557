package gateway

import (
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// upgradeSpec gives an "upgrade" command its UpgradeSpec from the stored
// spec (the API's UpgradeSpec, base URL resolved). Other kinds are left
// alone.
func upgradeSpec(cmd *sessionv1.Command, c *store.Command) error {
	if c.Kind != "upgrade" {
		return nil
	}
	spec := &apiv1.UpgradeSpec{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(c.Spec, spec); err != nil {
		return err
	}
	cmd.Spec = &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{Version: spec.GetVersion(), BaseUrl: spec.GetBaseUrl()}}
	return nil
}
