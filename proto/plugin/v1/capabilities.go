package pluginv1

// Capability strings of bettercompute.plugin.v1 (plugin.proto): what a
// plugin announces in InfoResponse.capabilities. These constants are the
// one definition of the wire names; bcd/plugin uses them at both ends.
const (
	// CapabilityPower: Power with every PowerAction.
	CapabilityPower = "power"
	// CapabilityBoot: BootDevice.
	CapabilityBoot = "boot"
	// CapabilityBMCInfo: BMCInfo.
	CapabilityBMCInfo = "bmc.info"
)

// Capabilities lists every capability a plugin may announce.
var Capabilities = []string{CapabilityPower, CapabilityBoot, CapabilityBMCInfo}
