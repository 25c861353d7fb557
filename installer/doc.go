// Package installer writes the install script that site admins pipe to sh
// (DESIGN.md, "Installer") and the systemd units of bcd.
//
// Generate checks every option, verifies the release manifest against the
// pinned keys when one is given, and renders a POSIX sh script from an
// embedded template. The script pins the sha256 of each binary it may
// download, taken from the verified manifest, so a host installs nothing whose
// digest does not match: see docs/install.md for the trust chain.
//
// The script is only function definitions, its last line the call
// `main "$@" --end-of-install-script`, so that a download cut short runs
// nothing (main refuses without the end marker). With Options.PinnedPubKey
// every download uses curl with the server's TLS key pinned; plain HTTP to a
// host that is not loopback is refused unless Options.AllowHTTP and a signed
// manifest allow it, by Generate and again by the script. Package
// installer/manifest builds, signs and verifies release manifests.
package installer
