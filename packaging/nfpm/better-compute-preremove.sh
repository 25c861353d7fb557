#!/bin/sh
# preremove of the better-compute package: stop and disable the service on
# removal (not on upgrade). /var/lib/better-compute (the embedded database,
# the PKI) and /etc/better-compute are kept.
set -e
case "${1:-}" in
upgrade | 1) exit 0 ;; # deb upgrade | rpm upgrade (one version left)
esac
if [ -d /run/systemd/system ]; then
	systemctl disable --now better-compute.service || true
fi
