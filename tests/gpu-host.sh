#!/bin/sh
# gpu-host.sh runs bcd's GPU inventory and each of its health readers once
# against this machine's real NVIDIA driver and prints what each saw
# (tests/gpuhost; docs/gpu-health.md, "On a real GPU host"). Elsewhere it
# prints "no NVIDIA driver; skipped" and exits 0. Run it as root to read the
# kernel log.
#
#   tests/gpu-host.sh [-kmsg-for 5s]
set -eu
cd "$(dirname "$0")/.."

if ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1' && [ ! -e /proc/driver/nvidia/version ]; then
	echo "no NVIDIA driver; skipped"
	exit 0
fi
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
exec go run ./tests/gpuhost "$@"
