#!/bin/sh
# postinstall of the bcd package: create the users bcd and bcd-cmd (commands
# run as it) and reload systemd.
# The services are not enabled here: a node must join first
# (bcd join --gateway URL --token-file F), then
# systemctl enable --now bcd-helper.service bcd.service.
set -e
if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers bcd.conf || true
else
	getent passwd bcd >/dev/null 2>&1 ||
		useradd --system --home-dir /var/lib/bcd --shell /usr/sbin/nologin bcd || true
	getent passwd bcd-cmd >/dev/null 2>&1 ||
		useradd --system --user-group --home-dir /var/lib/bcd/home --shell /usr/sbin/nologin bcd-cmd || true
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	# An upgrade restarts running services on the new binary.
	systemctl try-restart bcd-helper.service bcd.service || true
fi
