#!/bin/sh
# preremove of the bcd package: stop and disable the services on removal (not
# on upgrade). The node's identity in /var/lib/bcd is kept.
set -e
case "${1:-}" in
upgrade | 1) exit 0 ;; # deb upgrade | rpm upgrade (one version left)
esac
if [ -d /run/systemd/system ]; then
	systemctl disable --now bcd.service bcd-helper.service || true
fi
