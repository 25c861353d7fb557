// Package bmc carries out bcd's BMC commands (power.status, power.on,
// power.off, power.soft-off, power.cycle, power.reset and boot.set) through
// a BMC plugin (bcx-ipmi) run by bcd/plugin's Host.
//
// It runs where root runs: in the root helper beside an unprivileged bcd
// (helper operation "bmc"), or in bcd itself when bcd runs as root. The
// Controller resolves which BMC a Request means, reads its credentials, calls
// the plugin and returns a Result that becomes the command's detail_json.
//
// Which BMC, and whose credentials:
//
//   - Request.BMC empty: the node's own BMC. Its credentials are those the
//     control plane sealed for the node (the secret "bmc/<node id>", fetched
//     by bcd through JoinService.Secret and passed in Request.Credentials)
//     when there are any, else the "bmc" entry of the BMC file.
//   - Request.BMC a name: the entry of that name in the BMC file's "bmcs"
//     list, for a site agent that powers on machines which run no daemon yet.
//     Named BMCs come from the file only.
//
// The BMC file (DefaultFile, /etc/bcd/bmc.yaml) is YAML, owned by root (or by
// the user bcd runs as, when bcd is not root) and readable by its owner only
// (mode 0600 or 0400): a file that others can read, or that is owned by
// another user, is refused. Unknown keys are errors. It is read at every call,
// so edits take effect at once.
//
//	plugin: ipmi              # the BMC plugin, bcx-<plugin>; default ipmi
//	bmc:                      # this machine's own BMC
//	  address: 10.1.2.3       # host name or IP address, no port, no scheme
//	  username: admin
//	  password: "..."
//	  providers: [ipmitool, redfish]   # tried in this order; default both
//	  timeout: 30s            # per call, all providers together; default 30s
//	  ipmiPort: 623           # default 623
//	  ipmiCipherSuite: "3"    # ipmitool -C; default 3
//	  redfishPort: 443        # default 443
//	  redfishCAFile: /etc/bcd/bmc-ca.pem   # verify Redfish TLS against it
//	bmcs:                     # a site agent's machines without a daemon
//	  - name: rack1-u07       # 1 to 63 of A-Z a-z 0-9 . - _
//	    address: 10.1.7.7
//	    username: admin
//	    password: "..."
//
// Secrets: a password travels only from the file or the sealed secret to the
// plugin's gRPC request. Results never hold one, and every error this
// package returns has the call's password replaced by "[REDACTED]" (the
// plugin host scrubs its own errors and logs too).
package bmc
