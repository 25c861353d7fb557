// Package downloads serves bcd releases to sites from a folder: the api
// role's GET {basePath}/downloads/... route, which air-gapped sites use
// instead of the internet (DESIGN.md, "api"; docs/install.md).
//
// Routes, under {basePath}/downloads/:
//
//	{artifact}/{version}/{os}-{arch}              the executable (artifact bcd or bcx-ipmi)
//	{artifact}/{version}/manifest.json            the release manifest
//	{artifact}/{version}/manifest.json.minisig    its signature
//
// The folder (downloads.dir) is a goreleaser dist folder, a mirror of one, or
// a folder of them named by version:
//
//	dir/metadata.json (or manifest.json) naming the version   one release
//	dir/<version>/...                                          several releases
//
// In a release folder the executable is goreleaser's build output,
// <artifact>_<os>_<arch>[_<variant>]/<artifact> (the first variant by name:
// amd64 v1 before v3); a mirror holding only archives is served the binary
// from <artifact>_<version>_<os>_<arch>.tar.gz, extracted once and kept in
// memory. Either way the bytes served are the executable itself, whose sha256
// is the manifest's "binary" entry; the install script and bcd upgrade check
// it before installing.
//
// Responses carry Content-Length, a strong ETag (the sha256), Range support
// (http.ServeContent), Repr-Digest (RFC 9530) and the older Digest (RFC 3230)
// header. Unknown artifacts, versions and platforms are 404 with
// {"code":"NOT_FOUND","message":...}. Every file is opened through an
// os.Root, so neither "..", encoded separators, nor symbolic links can reach
// outside the folder.
package downloads
