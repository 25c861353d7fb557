#!/bin/sh
# postinstall of the better-compute package: create the better-compute user,
# let it (and only it) read its configuration, and reload systemd. The
# service is not enabled here: edit /etc/better-compute/config.yaml, then
# systemctl enable --now better-compute.
set -e
if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers better-compute.conf || true
elif ! getent passwd better-compute >/dev/null 2>&1; then
	useradd --system --user-group --home-dir /var/lib/better-compute --shell /usr/sbin/nologin better-compute || true
fi
# The configuration may hold a database password and the deployment secret:
# root writes it, the service's group reads it.
if [ -f /etc/better-compute/config.yaml ] && getent group better-compute >/dev/null 2>&1; then
	chgrp better-compute /etc/better-compute/config.yaml || true
	chmod 0640 /etc/better-compute/config.yaml || true
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	# An upgrade restarts a running control plane on the new binary.
	systemctl try-restart better-compute.service || true
fi
