// Package ipmi is bcx-ipmi, bcd's BMC plugin: power and boot control and BMC
// information through bmclib v2 (github.com/bmc-toolbox/bmclib/v2), served to
// bcd over the plugin protocol bettercompute.plugin.v1 (bcd/plugin).
//
// Providers, tried in the order the call's BMCTarget gives (default
// ipmitool, then Redfish) until one succeeds, each with an equal share of
// the time the target's timeout (default 30 s) has left:
//
//   - ipmitool: IPMI v2.0 over LAN (lanplus) through bmclib's ipmitool
//     provider, cipher suite 3 unless the target says otherwise (ipmitool
//     probes for about 11 s without -C), UDP port 623 unless set.
//   - Redfish: bmclib's gofish provider over HTTPS, port 443 unless set,
//     with a Redfish session (logged out after each call). The BMC's
//     certificate is verified against BMCTarget.redfish_ca_pem when given,
//     and not verified otherwise.
//
// Power status is normalised to on or off (ipmitool says "Chassis Power is
// on", Redfish "On"). BMC information is what bmclib does not offer through
// these providers, so the plugin reads it itself: `ipmitool mc info` with the
// same invocation bmclib uses, and the Redfish ComputerSystem and Manager
// through gofish.
//
// Secrets: bmclib hands ipmitool the password in the environment variable
// IPMITOOL_PASSWORD with -E, never in argv (where any user could read it
// with ps); the plugin's own ipmitool calls do the same. The environment of
// a process is readable only by its user and root (/proc/<pid>/environ,
// mode 0400). Over Redfish the password goes only in the session login's
// JSON body. bmclib's logr logging is routed to slog through a handler that
// scrubs the call's password, every error message is scrubbed before it
// leaves, and gofish's DEBUG_BMCLIB request dump (which would print the
// login body) is switched off by clearing that variable at start. Error
// messages name the BMC by its address.
package ipmi
