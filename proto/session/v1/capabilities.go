package sessionv1

// Capabilities: the strings of Hello.capabilities and Welcome.capabilities,
// as session.proto's file comment lists them with their meaning. These
// constants are the one definition of the wire names; bcd offers them and
// the gateway grants them. CapabilityTunnel is in tunnel.go.
const (
	// CapabilityExec runs Command kind "exec".
	CapabilityExec = "exec"
	// CapabilityCancel honours Cancel for running commands.
	CapabilityCancel = "cancel"
	// CapabilityInventory sends Inventory and runs "inventory.refresh".
	CapabilityInventory = "inventory.v1"
	// CapabilityGPUNVML reads GPUs through NVML (GPU health and events).
	CapabilityGPUNVML = "gpu.nvml"
	// CapabilityPower runs the power.* kinds through a BMC plugin.
	CapabilityPower = "power"
	// CapabilityBoot runs "boot.set" through a BMC plugin.
	CapabilityBoot = "boot"
	// CapabilityUpgrade runs "upgrade".
	CapabilityUpgrade = "upgrade"
	// CapabilityReboot runs "reboot".
	CapabilityReboot = "reboot"
	// CapabilityResume sends Hello.resume and Hello.pending_results after a
	// reconnect.
	CapabilityResume = "resume"
	// CapabilityGPUReset runs "gpu.reset" through the root helper.
	CapabilityGPUReset = "gpu.reset"
	// CapabilityGPUDiag runs "gpu.diag": DCGM's diagnostic through the
	// root helper, or the built-in NVML check.
	CapabilityGPUDiag = "gpu.diag"
	// CapabilityRollback runs "rollback".
	CapabilityRollback = "rollback"
	// CapabilityReleasePins applies ReleasePins and answers
	// ReleasePinsHeld.
	CapabilityReleasePins = "release.pins"
	// CapabilityGatewayBundle keeps a Bundle's gateway_ca_roots (a
	// gateway-CA rotation) and acks only then.
	CapabilityGatewayBundle = "gateway.bundle"
)

// Capabilities lists every capability of this protocol version in
// session.proto's order, the registry the wire-name checks
// (tests/wirenames_test.go) hold the code and session.proto to.
var Capabilities = []string{
	CapabilityExec, CapabilityCancel, CapabilityInventory, CapabilityGPUNVML, CapabilityPower, CapabilityBoot,
	CapabilityUpgrade, CapabilityReboot, CapabilityResume, CapabilityGPUReset, CapabilityGPUDiag, CapabilityRollback, CapabilityTunnel,
	CapabilityReleasePins, CapabilityGatewayBundle,
}
