package gpu

import (
	"fmt"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
)

// fabricFindings judges the GPU's NVLink fabric registration: short of
// completed for Thresholds.FabricGrace (nvidia-fabricmanager trains the
// fabric at boot, so a while is normal), or completed with a status other
// than SUCCESS, is a degraded finding calling for ESCALATE (the fabric
// manager needs a person: its service, its log, the NVSwitches). It ends
// at the first scan that reads the state completed and successful.
func (st *gpuState) fabricFindings(f *Fabric, p assessParams) []finding {
	if f == nil || f.State == "COMPLETED" && f.Status == "SUCCESS" {
		st.fabricSince = time.Time{}
		return nil
	}
	if st.fabricSince.IsZero() {
		st.fabricSince = p.now
	}
	waited := p.now.Sub(st.fabricSince)
	if f.State != "COMPLETED" && waited < p.th.FabricGrace {
		return nil
	}
	c := *f
	reason := fmt.Sprintf("NVLink fabric state %s for %v", f.State, waited.Round(time.Second))
	if f.State == "COMPLETED" {
		reason = "NVLink fabric registration failed: " + f.Status
	}
	return []finding{{health: HealthDegraded, resolution: xid.Escalate, reason: reason,
		key:    EventKindFabric + "/" + f.State + "/" + f.Status,
		signal: &Event{Kind: EventKindFabric, Fabric: &c, FabricFor: waited}}}
}
