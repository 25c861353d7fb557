#!/usr/bin/env bash
# PgBouncer in transaction mode in front of the test PostgreSQL, for the
# tests that run through it (BETTER_COMPUTE_TEST_PGBOUNCER_URL):
#
#   tests/pgbouncer.sh start   start it (or find it running) and print its URL
#   tests/pgbouncer.sh stop    stop it
#
#   export BETTER_COMPUTE_TEST_PGBOUNCER_URL=$(tests/pgbouncer.sh start)
#
# It listens on 127.0.0.1:${PGBOUNCER_PORT:-6432} and serves every database
# of the server on 127.0.0.1:${PGBOUNCER_SERVER_PORT:-5432} under its own
# name (trust auth, user postgres; the failover tests run one in front of
# each server of their own pair, with PGBOUNCER_DATABASE naming the
# database the URL it prints and its check use), with the [pgbouncer] settings docs/scaling.md gives plus the
# test's paths and pool caps. Debian's pgbouncer refuses to run as root: it
# runs as postgres (-u postgres) and reads its files as that user. Its
# files, log included, are in ${PGBOUNCER_DIR:-/tmp/better-compute-pgbouncer}.
set -euo pipefail

dir=${PGBOUNCER_DIR:-/tmp/better-compute-pgbouncer}
port=${PGBOUNCER_PORT:-6432}
server_port=${PGBOUNCER_SERVER_PORT:-5432}
database=${PGBOUNCER_DATABASE:-test}
url="postgres://postgres@127.0.0.1:${port}/${database}?sslmode=disable"

# up reports whether PgBouncer answers a query on the port.
up() {
	psql "postgres://postgres@127.0.0.1:${port}/${database}?sslmode=disable&connect_timeout=2" -tAqc "SELECT 1" >/dev/null 2>&1
}

case ${1:-} in
start)
	if up; then
		echo "$url"
		exit 0
	fi
	command -v pgbouncer >/dev/null 2>&1 || {
		echo "pgbouncer is not installed (apt-get install pgbouncer)" >&2
		exit 1
	}
	mkdir -p "$dir"
	cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=${server_port}

[pgbouncer]
; As docs/scaling.md gives:
pool_mode = transaction
query_wait_timeout = 10
; The test's own:
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = trust
auth_file = ${dir}/userlist.txt
admin_users = postgres
; Each test has its own database, so its own pool: cap what all of them
; together hold of the server's 100 connections.
default_pool_size = 10
max_user_connections = 40
max_client_conn = 2000
logfile = ${dir}/pgbouncer.log
pidfile = ${dir}/pgbouncer.pid
EOF
	echo '"postgres" ""' >"$dir/userlist.txt"
	if [ "$(id -u)" = 0 ]; then
		chown -R postgres: "$dir"
		runas=(-u postgres)
	else
		runas=()
	fi
	pgbouncer -d "${runas[@]}" "$dir/pgbouncer.ini"
	for _ in $(seq 1 50); do
		if up; then
			echo "$url"
			exit 0
		fi
		sleep 0.1
	done
	echo "PgBouncer did not answer on 127.0.0.1:${port} within 5 s; its log:" >&2
	tail -20 "$dir/pgbouncer.log" >&2 || true
	exit 1
	;;
stop)
	if [ -f "$dir/pgbouncer.pid" ]; then
		pid=$(cat "$dir/pgbouncer.pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		rm -f "$dir/pgbouncer.pid"
	fi
	;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac
