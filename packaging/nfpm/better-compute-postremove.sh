#!/bin/sh
# postremove of the better-compute package: reload systemd after the unit is
# gone.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
