#!/bin/sh
# generate.sh regenerates the Go code for every .proto file under proto/ with
# pinned generator versions, and the operator API's method table, Go client
# (controlplane/pkg/client/methods.bcapi.go) and OpenAPI document
# (proto/api/v1/openapi.json) from its services with protoc-gen-bcapi
# (proto/internal/protoc-gen-bcapi).
#
#   proto/generate.sh          regenerate in place (and remove generated files
#                              whose .proto is gone)
#   proto/generate.sh --check  regenerate into a temporary directory and exit 1,
#                              listing the stale files, when a committed
#                              file differs; changes nothing (for CI)
#
# Generators are installed once into ${BETTER_COMPUTE_TOOLS:-$HOME/.cache/better-compute/tools}/bin
# and reused while they are at the pinned version. protoc itself comes from the
# system (Debian: protobuf-compiler and libprotobuf-dev); see proto/README.md.
set -eu

PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
# The protoc version the committed files were generated with. Another version
# still works (the generated code does not depend on it) but changes the
# "// 	protoc" line in the headers, which --check ignores.
PROTOC_VERSION=3.21.12

usage() {
	echo "usage: $0 [--check]" >&2
	exit 2
}

check=false
case $# in
0) ;;
1)
	case $1 in
	--check) check=true ;;
	-h | --help)
		sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) usage ;;
	esac
	;;
*) usage ;;
esac

die() {
	echo "generate.sh: $*" >&2
	exit 1
}

root=$(cd "$(dirname "$0")/.." && pwd)
tools=${BETTER_COMPUTE_TOOLS:-$HOME/.cache/better-compute/tools}
bin=$tools/bin

command -v go >/dev/null 2>&1 || die "go not found in PATH"

# install_tool BINARY PACKAGE VERSION VERSION_LINE installs PACKAGE@VERSION into
# $bin unless $bin/BINARY --version already prints VERSION_LINE.
install_tool() {
	if [ -x "$bin/$1" ] && [ "$("$bin/$1" --version 2>/dev/null || true)" = "$4" ]; then
		return 0
	fi
	echo "generate.sh: installing $2@$3 into $bin" >&2
	mkdir -p "$bin"
	# go install refuses to overwrite a file it did not build (a script, say).
	rm -f "$bin/$1"
	# Outside the module, so go.mod is neither read nor changed.
	(cd / && GOBIN=$bin GOFLAGS='' go install "$2@$3") ||
		die "go install $2@$3 failed"
	[ "$("$bin/$1" --version 2>/dev/null || true)" = "$4" ] ||
		die "$bin/$1 does not report $4 after install"
}

install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go \
	"$PROTOC_GEN_GO_VERSION" "protoc-gen-go $PROTOC_GEN_GO_VERSION"
install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
	"$PROTOC_GEN_GO_GRPC_VERSION" "protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION#v}"

# find_wkt prints the include directory holding google/protobuf/timestamp.proto.
find_wkt() {
	protoc_dir=$(dirname "$(command -v protoc)")
	for dir in "$protoc_dir/../include" /usr/include /usr/local/include; do
		if [ -f "$dir/google/protobuf/timestamp.proto" ]; then
			(cd "$dir" && pwd)
			return 0
		fi
	done
	return 1
}

if ! command -v protoc >/dev/null 2>&1 || ! find_wkt >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "generate.sh: installing protobuf-compiler and libprotobuf-dev" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y protobuf-compiler libprotobuf-dev >&2 ||
			{ apt-get update >&2 &&
				DEBIAN_FRONTEND=noninteractive apt-get install -y protobuf-compiler libprotobuf-dev >&2; } ||
			die "apt-get install protobuf-compiler libprotobuf-dev failed"
	fi
	command -v protoc >/dev/null 2>&1 ||
		die "protoc not found: install protoc $PROTOC_VERSION (Debian: apt-get install protobuf-compiler libprotobuf-dev)"
fi
wkt=$(find_wkt) ||
	die "google/protobuf/timestamp.proto not found: install the well-known types (Debian: apt-get install libprotobuf-dev)"

protoc_version=$(protoc --version | sed 's/^libprotoc //')
if [ "$protoc_version" != "$PROTOC_VERSION" ]; then
	echo "generate.sh: warning: protoc $protoc_version, the committed files use $PROTOC_VERSION" >&2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bc-proto.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Every .proto under proto/, relative to proto/ (the import root). Sorted so the
# protoc command line, and so its output, does not depend on the file system.
cd "$root/proto"
find . -name '*.proto' -type f | sed 's|^\./||' | LC_ALL=C sort >"$tmp/protos"
[ -s "$tmp/protos" ] || die "no .proto files under $root/proto"
mkdir "$tmp/out"
# The file list is split on white space below, so no path may contain any.
if grep -q '[[:space:]]' "$tmp/protos"; then
	die "a .proto path under proto/ contains white space"
fi
# shellcheck disable=SC2046 # split on purpose; checked above
protoc -I . -I "$wkt" \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--go_out=paths=source_relative:"$tmp/out" \
	$(cat "$tmp/protos") ||
	die "protoc failed"
# gRPC stubs for every file but the operator API's (api/), whose services
# are served as POST {basePath}/{group}/{method} with JSON, not gRPC.
grep -v '^api/' "$tmp/protos" >"$tmp/grpc-protos" || true
# shellcheck disable=SC2046 # split on purpose; checked above
protoc -I . -I "$wkt" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
	--go-grpc_out=paths=source_relative:"$tmp/out" \
	$(cat "$tmp/grpc-protos") ||
	die "protoc failed"

# The operator API's method table, Go client and OpenAPI document, from its
# services (proto/internal/protoc-gen-bcapi, built from this checkout). Its
# output paths are relative to the repository root.
mkdir "$tmp/bcapi"
(cd "$root" && GOFLAGS='' go build -o "$tmp/protoc-gen-bcapi" ./proto/internal/protoc-gen-bcapi) ||
	die "go build ./proto/internal/protoc-gen-bcapi failed"
grep '^api/v1/' "$tmp/protos" >"$tmp/api-protos" || die "no .proto files under $root/proto/api/v1"
# shellcheck disable=SC2046 # split on purpose; checked above
protoc -I . -I "$wkt" \
	--plugin=protoc-gen-bcapi="$tmp/protoc-gen-bcapi" \
	--bcapi_out="$tmp/bcapi" \
	$(cat "$tmp/api-protos") ||
	die "protoc (protoc-gen-bcapi) failed"
(cd "$tmp/bcapi" && find . -type f | sed 's|^\./||' | LC_ALL=C sort) >"$tmp/bcapi-new"
# Committed files protoc-gen-bcapi wrote: openapi.json and *.bcapi.go files
# whose header names it.
(cd "$root" && find proto controlplane -name '*.bcapi.go' -type f | LC_ALL=C sort | while read -r f; do
	if head -n 1 "$f" | grep -q '^// Code generated by protoc-gen-bcapi'; then
		echo "$f"
	fi
done) >"$tmp/bcapi-old"

# Generated files: what protoc wrote now, and what is committed (a .pb.go file
# under proto/ whose header says it was generated by protoc-gen-go*).
(cd "$tmp/out" && find . -name '*.pb.go' -type f | sed 's|^\./||' | LC_ALL=C sort) >"$tmp/new"
find . -name '*.pb.go' -type f | sed 's|^\./||' | LC_ALL=C sort | while read -r f; do
	if sed -n '1,/^package /p' "$f" | grep -q '^// Code generated by protoc-gen-go'; then
		echo "$f"
	fi
done >"$tmp/old"

# without_protoc_line prints FILE without the header line naming the protoc
# version ("// <TAB>protoc  vX" from protoc-gen-go, "// - protoc  vX" from
# protoc-gen-go-grpc), the one line that depends on the local protoc rather
# than on the sources.
tab=$(printf '\t')
without_protoc_line() {
	sed -e "/^\/\/ ${tab}protoc  *[v(]/d" -e '/^\/\/ - protoc  *[v(]/d' "$1"
}

: >"$tmp/stale"
while read -r f; do
	if [ ! -f "$f" ]; then
		echo "proto/$f (missing)" >>"$tmp/stale"
	elif ! cmp -s "$f" "$tmp/out/$f"; then
		without_protoc_line "$f" >"$tmp/a"
		without_protoc_line "$tmp/out/$f" >"$tmp/b"
		if $check && cmp -s "$tmp/a" "$tmp/b"; then
			continue
		fi
		echo "proto/$f (differs)" >>"$tmp/stale"
	fi
done <"$tmp/new"
LC_ALL=C comm -13 "$tmp/new" "$tmp/old" | while read -r f; do
	echo "proto/$f (no .proto generates it)"
done >>"$tmp/stale"
while read -r f; do
	if [ ! -f "$root/$f" ]; then
		echo "$f (missing)" >>"$tmp/stale"
	elif ! cmp -s "$root/$f" "$tmp/bcapi/$f"; then
		echo "$f (differs)" >>"$tmp/stale"
	fi
done <"$tmp/bcapi-new"
LC_ALL=C comm -13 "$tmp/bcapi-new" "$tmp/bcapi-old" | while read -r f; do
	echo "$f (no .proto generates it)"
done >>"$tmp/stale"

if $check; then
	if [ -s "$tmp/stale" ]; then
		{
			echo "generate.sh: generated files are stale:"
			sed 's/^/  /' "$tmp/stale"
			echo "run proto/generate.sh and commit the result"
		} >&2
		exit 1
	fi
	echo "generate.sh: generated files are up to date" >&2
	exit 0
fi

while read -r f; do
	if ! cmp -s "$tmp/out/$f" "$f" 2>/dev/null; then
		mkdir -p "$(dirname "$f")"
		cp "$tmp/out/$f" "$f"
		echo "generate.sh: wrote proto/$f" >&2
	fi
done <"$tmp/new"
LC_ALL=C comm -13 "$tmp/new" "$tmp/old" | while read -r f; do
	rm -f "$f"
	echo "generate.sh: removed proto/$f" >&2
done
while read -r f; do
	if ! cmp -s "$tmp/bcapi/$f" "$root/$f" 2>/dev/null; then
		mkdir -p "$(dirname "$root/$f")"
		cp "$tmp/bcapi/$f" "$root/$f"
		echo "generate.sh: wrote $f" >&2
	fi
done <"$tmp/bcapi-new"
LC_ALL=C comm -13 "$tmp/bcapi-new" "$tmp/bcapi-old" | while read -r f; do
	rm -f "$root/$f"
	echo "generate.sh: removed $f" >&2
done
