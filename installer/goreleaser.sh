#!/bin/sh
# goreleaser.sh installs goreleaser at a pinned version into a cached tool
# directory (only when that exact version is not already there) and runs a
# snapshot release with it: archives, nfpm packages and checksums under dist/,
# offline, nothing published.
#
#   installer/goreleaser.sh [--install-only] [extra goreleaser release args...]
#
# BETTER_COMPUTE_TOOLS names the tool cache (default
# $HOME/.cache/better-compute/tools); the binary lands in its bin/. Compiling
# goreleaser takes about 13 minutes on two cores, so run --install-only once,
# early and in the background (nice -n 19), and every later run reuses it.
set -eu

GORELEASER_VERSION=v2.15.1
TOOLS=${BETTER_COMPUTE_TOOLS:-$HOME/.cache/better-compute/tools}
GOBIN_DIR=$TOOLS/bin
GORELEASER=$GOBIN_DIR/goreleaser

installed_version() {
	[ -x "$GORELEASER" ] || return 1
	# "goreleaser --version" prints a banner; the GitVersion line holds the tag.
	"$GORELEASER" --version 2>/dev/null | awk '/^GitVersion:/ {print $2; exit}'
}

install_goreleaser() {
	have=$(installed_version || true)
	if [ "$have" = "$GORELEASER_VERSION" ] || [ "v$have" = "$GORELEASER_VERSION" ]; then
		return 0
	fi
	mkdir -p "$GOBIN_DIR"
	echo "goreleaser.sh: installing goreleaser $GORELEASER_VERSION into $GOBIN_DIR (about 13 minutes)" >&2
	# Install into a temporary GOBIN and move the binary into place, so an
	# interrupted build never leaves a half-written goreleaser behind.
	tmp=$(mktemp -d "$TOOLS/install.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	GOBIN=$tmp GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
		go install "github.com/goreleaser/goreleaser/v2@$GORELEASER_VERSION"
	mv -f "$tmp/goreleaser" "$GORELEASER"
	rm -rf "$tmp"
	trap - EXIT
}

install_only=false
if [ "${1:-}" = "--install-only" ]; then
	install_only=true
	shift
fi

install_goreleaser
if [ "$install_only" = true ]; then
	exit 0
fi

cd "$(dirname "$0")/.."
# goreleaser drops all git information (commit, its date, so the
# reproducible timestamps too) when the checkout has no remote. Give such a
# checkout the module's URL through git's environment configuration, which
# changes no file.
if ! git ls-remote --get-url >/dev/null 2>&1 && [ -z "${GIT_CONFIG_COUNT:-}" ]; then
	export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=remote.origin.url \
		GIT_CONFIG_VALUE_0=https://github.com/better-compute/better-compute
fi
exec "$GORELEASER" release --snapshot --clean --skip=publish "$@"
