#!/bin/sh
# postremove of the bcd package: reload systemd after the units are gone.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
