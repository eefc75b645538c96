#!/usr/bin/env bash
# Run a command against throwaway Redis, Redis Cluster, Redis Sentinel and
# Postgres servers.
#
#   scripts/with-servers.sh COMMAND [ARGS...]
#
# The command sees:
#   BATCHMR_TEST_REDIS_URL            redis://127.0.0.1:PORT/0      (standalone)
#   BATCHMR_TEST_REDIS_CLUSTER_ADDRS  127.0.0.1:PORT,...            (Cluster: three primaries,
#                                     three replicas, cluster-node-timeout 5s)
#   BATCHMR_TEST_REDIS_SENTINEL_URL   redis://127.0.0.1:PORT/0?master_name=batchmr&addr=127.0.0.1:PORT&addr=...
#                                     (a primary, its replica, three Sentinels, down after 10s)
#   BATCHMR_TEST_DATABASE_URL         postgres://postgres@127.0.0.1:PORT/batchmr_test?sslmode=disable
#   BATCHMR_TEST_CHROMIUM             /usr/bin/chromium             (the console's browser tests)
#
# Everything lives in one private temp dir on random loopback ports, so
# parallel runs don't collide and any Redis/Postgres already on the machine
# is left alone. The servers are always torn down, also when this script
# gets INT or TERM, and the script exits with the command's status. Startup
# takes a few seconds on an idle machine.
#
# To use servers of your own instead, set BATCHMR_TEST_REDIS_URL and
# BATCHMR_TEST_DATABASE_URL (and optionally BATCHMR_TEST_REDIS_CLUSTER_ADDRS
# and BATCHMR_TEST_REDIS_SENTINEL_URL: without them the Cluster and Sentinel
# tests are skipped).
set -euo pipefail

prog=with-servers.sh
say() { echo "$prog: $*" >&2; }
die() { say "$*"; exit 1; }

[[ $# -gt 0 ]] || die "usage: scripts/with-servers.sh COMMAND [ARGS...]"

# --- Chromium, for the web console's browser tests ------------------------------

# The browser tests skip only when BATCHMR_TEST_CHROMIUM is unset, so make
# test finds Chromium (installing Debian's as root) and sets it. A value the
# caller set is kept as it is: the tests fail if it does not work.
# BATCHMR_NO_BROWSER=1 (make demo, bench, chaos) skips all of this.
find_chromium() {
	local c
	for c in chromium chromium-browser google-chrome; do
		[[ -n "$c" ]] && command -v "$c" >/dev/null 2>&1 && { command -v "$c"; return 0; }
	done
	return 1
}
if [[ "${BATCHMR_NO_BROWSER:-}" == 1 ]]; then
	chromium_bin="" # make demo, bench and chaos run no browser: do not install one
elif [[ -n "${BATCHMR_TEST_CHROMIUM:-}" ]]; then
	chromium_bin=$BATCHMR_TEST_CHROMIUM
elif ! chromium_bin=$(find_chromium); then
	if [[ $(id -u) -eq 0 ]]; then
		say "installing chromium (apt-get)..."
		apt_log=$(mktemp)
		if ! { apt-get -o DPkg::Lock::Timeout=600 update &&
			DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
				install -y --no-install-recommends chromium; } >"$apt_log" 2>&1; then
			cat "$apt_log" >&2
			rm -f "$apt_log"
			die "apt-get install chromium failed (log above)"
		fi
		rm -f "$apt_log"
		chromium_bin=$(find_chromium) || die "still no chromium after apt-get install chromium"
	else
		say "chromium not found: the console's browser tests will skip (run 'sudo apt-get install chromium', or set BATCHMR_TEST_CHROMIUM)"
		chromium_bin=""
	fi
fi
if [[ -n "$chromium_bin" ]]; then
	export BATCHMR_TEST_CHROMIUM=$chromium_bin
fi

# A developer pointing at their own servers needs none of the machinery below,
# not even locally installed server binaries.
if [[ -n "${BATCHMR_TEST_REDIS_URL:-}" && -n "${BATCHMR_TEST_DATABASE_URL:-}" ]]; then
	exec "$@"
fi

# Postgres refuses to run as root, so as root we run it as this system user.
pg_user=batchmr-test
is_root=0
[[ $(id -u) -eq 0 ]] && is_root=1

# --- Finding and installing the server binaries ------------------------------

# Debian keeps the Postgres server binaries off PATH (under
# /usr/lib/postgresql/VERSION/bin), and pg_config may belong to a client-only
# libpq-dev of another version, so try each place and take the first that
# really holds a server.
find_pg_bindir() {
	local dir cand=()
	if command -v pg_config >/dev/null 2>&1; then
		cand+=("$(pg_config --bindir 2>/dev/null || true)")
	fi
	if command -v initdb >/dev/null 2>&1; then
		cand+=("$(dirname "$(readlink -f "$(command -v initdb)")")")
	fi
	while IFS= read -r dir; do
		cand+=("$dir")
	done < <(compgen -G '/usr/lib/postgresql/*/bin' | sort -rV)
	for dir in "${cand[@]}"; do
		if [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" && -x "$dir/postgres" ]]; then
			echo "$dir"
			return 0
		fi
	done
	return 1
}

missing_packages() {
	local pkgs=()
	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
		pkgs+=(redis-server)
	fi
	if ! find_pg_bindir >/dev/null; then
		pkgs+=(postgresql)
	fi
	echo "${pkgs[*]}"
}

missing=$(missing_packages)
if [[ -n "$missing" ]]; then
	if [[ $is_root -ne 1 ]]; then
		die "missing $missing: run 'sudo apt-get install redis-server postgresql', or set BATCHMR_TEST_REDIS_URL and BATCHMR_TEST_DATABASE_URL to existing servers"
	fi
	say "installing $missing (apt-get)..."
	apt_log=$(mktemp)
	# The lock timeout lets two runs on a fresh machine install one after the
	# other instead of the second failing on dpkg's lock.
	if ! { apt-get -o DPkg::Lock::Timeout=600 update &&
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
			install -y --no-install-recommends redis-server postgresql; } >"$apt_log" 2>&1; then
		cat "$apt_log" >&2
		rm -f "$apt_log"
		die "apt-get install redis-server postgresql failed (log above)"
	fi
	rm -f "$apt_log"
	missing=$(missing_packages)
	[[ -z "$missing" ]] || die "still missing $missing after apt-get install"
fi

pg_bin=$(find_pg_bindir)
# Prefer the psql next to the server: Debian's /usr/bin/psql is a wrapper
# that guesses a cluster and may warn.
psql_bin="$pg_bin/psql"
[[ -x "$psql_bin" ]] || psql_bin=$(command -v psql) || die "psql not found (apt-get install postgresql-client)"

if [[ $is_root -eq 1 ]] && ! getent passwd "$pg_user" >/dev/null; then
	# Two parallel first runs may race here: whichever loses finds the user
	# made by the other (or retries while /etc/passwd is locked).
	for _ in $(seq 1 20); do
		useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user" 2>/dev/null || true
		getent passwd "$pg_user" >/dev/null && break
		sleep 0.5
	done
	getent passwd "$pg_user" >/dev/null || die "could not create system user $pg_user"
fi

# --- Temp dir, teardown -------------------------------------------------------

tmp=""
redis_pids=()
cluster_create_pid=""
initdb_pid=""
cmd_pid=""
pg_running=0
cmd_started=0

# Runs a Postgres tool as the user the server runs as. The cd is there
# because the unprivileged user may not be able to enter our cwd (e.g. /root).
as_pg() {
	if [[ $is_root -eq 1 ]]; then
		(cd "$tmp" && exec runuser -u "$pg_user" -- "$@")
	else
		(cd "$tmp" && exec "$@")
	fi
}

stop_pid() {
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for i in $(seq 1 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2317 # reached through the trap
cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	local pid
	[[ -n "$cmd_pid" ]] && stop_pid "$cmd_pid"
	[[ -n "$cluster_create_pid" ]] && stop_pid "$cluster_create_pid"
	[[ -n "$initdb_pid" ]] && stop_pid "$initdb_pid"
	# All at once, then each waited for: the servers stop together.
	for pid in "${redis_pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null
	done
	for pid in "${redis_pids[@]}"; do
		stop_pid "$pid"
	done
	# Checking postmaster.pid rather than pg_running also catches a server
	# that came up after pg_ctl -w gave up waiting for it.
	if [[ -n "$tmp" && ( $pg_running -eq 1 || -f "$tmp/pgdata/postmaster.pid" ) ]]; then
		as_pg "$pg_bin/pg_ctl" stop -D "$tmp/pgdata" -m immediate -w >/dev/null 2>&1
	fi
	[[ -n "$tmp" ]] && rm -rf "$tmp"
	if [[ $cmd_started -eq 0 && $rc -ne 0 ]]; then
		say "setup did not finish (status $rc), servers stopped"
	fi
	exit "$rc"
}
trap cleanup EXIT
# Signals go through exit so the EXIT trap does the teardown exactly once.
trap 'exit 130' INT
trap 'exit 143' TERM

# As root, the Postgres user must reach the temp dir: fall back to /tmp if
# TMPDIR is somewhere private to root.
tmp_base=${TMPDIR:-/tmp}
if [[ $is_root -eq 1 ]] && ! runuser -u "$pg_user" -- test -x "$tmp_base" 2>/dev/null; then
	tmp_base=/tmp
fi
tmp=$(mktemp -d "$tmp_base/batchmr-test.XXXXXX")
chmod 755 "$tmp"

# --- Postgres's data directory, made while Redis starts ----------------------

mkdir "$tmp/pgdata" "$tmp/pgsock"
touch "$tmp/pg.log" "$tmp/initdb.log"
if [[ $is_root -eq 1 ]]; then
	chown "$pg_user" "$tmp/pgdata" "$tmp/pgsock" "$tmp/pg.log" "$tmp/initdb.log"
fi

# C.UTF-8 always exists on Debian, unlike whatever LANG the caller has.
as_pg "$pg_bin/initdb" -D "$tmp/pgdata" -A trust -U postgres --no-sync \
	-E UTF8 --locale=C.UTF-8 >"$tmp/initdb.log" 2>&1 </dev/null &
initdb_pid=$!

# --- Ports ----------------------------------------------------------------------

used_ports=" "
port_pool=()

# Sets $port to a TCP port on 127.0.0.1 that is free right now. (A global,
# not output: used_ports must survive between calls.) Another process may
# still take the port before our server binds it; the start code below
# retries with a new port when that happens.
pick_port() {
	local p i
	for i in $(seq 1 200); do
		if [[ ${#port_pool[@]} -eq 0 ]] && command -v python3 >/dev/null 2>&1; then
			# Binding port 0 lets the kernel pick ones nobody has bound;
			# two dozen at once, because python3 is slow to start.
			mapfile -t port_pool < <(python3 -c 'import socket
ss = [socket.socket() for _ in range(24)]
for s in ss: s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in ss))' 2>/dev/null)
		fi
		p=""
		if [[ ${#port_pool[@]} -gt 0 ]]; then
			p=${port_pool[0]}
			port_pool=("${port_pool[@]:1}")
		fi
		if [[ ! "$p" =~ ^[0-9]+$ ]]; then
			# No python3 on a fresh machine: try random ports below Linux's
			# default ephemeral range (32768+), where outgoing connections
			# don't hold them, and skip any that accept a connection.
			p=$((20000 + RANDOM % 12000))
			if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
				continue
			fi
		fi
		if [[ "$used_ports" != *" $p "* ]]; then
			used_ports+="$p "
			port=$p
			return 0
		fi
	done
	die "could not find a free TCP port on 127.0.0.1"
}

# --- Redis ----------------------------------------------------------------------

redis_cli() {
	local port=$1
	shift
	timeout 5 redis-cli -h 127.0.0.1 -p "$port" "$@"
}

# start_redis NAME [CONFIG_FILE] EXTRA_ARGS... : starts a redis-server on a
# free port, sets $port and appends its pid to redis_pids. In EXTRA_ARGS,
# @PORT@ stands for the chosen port and @BUSPORT@ for a second free port
# (cluster bus).
start_redis() {
	local name=$1
	shift
	local conf=()
	if [[ $# -gt 0 && -f "$1" ]]; then
		conf=("$1") # redis-server takes its config file first
		shift
	fi
	local pid log i arg args busport=""
	for _ in 1 2 3 4 5; do
		if [[ "$*" == *@BUSPORT@* ]]; then
			pick_port
			busport=$port
		fi
		pick_port
		log="$tmp/redis-$name-$port.log"
		args=()
		for arg in "$@"; do
			arg=${arg//@PORT@/$port}
			args+=("${arg//@BUSPORT@/$busport}")
		done
		# Each its own dump file, which a replica writes as it syncs; no
		# delay before a primary streams its data to a replica.
		redis-server "${conf[@]}" --port "$port" --bind 127.0.0.1 --protected-mode no \
			--save "" --appendonly no --daemonize no --dir "$tmp" --dbfilename "dump-$port.rdb" \
			--repl-diskless-sync-delay 0 "${args[@]}" >"$log" 2>&1 &
		pid=$!
		# Recorded at once so a signal during startup still stops it.
		redis_pids+=("$pid")
		for i in $(seq 1 400); do
			if ! kill -0 "$pid" 2>/dev/null; then
				wait "$pid" 2>/dev/null || true
				break
			fi
			# Check the pid so a server someone else started on this port
			# in the meantime is never mistaken for ours.
			if [[ "$(redis_cli "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')" == "$pid" ]]; then
				return 0
			fi
			sleep 0.05
		done
		if kill -0 "$pid" 2>/dev/null; then
			stop_pid "$pid"
			cat "$log" >&2
			die "redis-server ($name) did not answer on 127.0.0.1:$port within 20s (log above)"
		fi
		# It is dead and reaped: forget the pid so cleanup can't hit a reuse.
		unset 'redis_pids[-1]'
		if ! grep -qi 'address already in use' "$log"; then
			cat "$log" >&2
			die "redis-server ($name) exited during startup (log above)"
		fi
		say "port $port${busport:+ or $busport} was taken, retrying redis-server ($name) on another"
	done
	die "redis-server ($name) could not get a free port"
}

start_redis standalone
redis_standalone_port=$port

# --- Redis Cluster: three primaries, three replicas -----------------------------

# Each node's bus gets its own free port: by default it is PORT+10000, which
# may be taken, or past 65535 for the high ports pick_port can return.
# --cluster-announce-ip makes CLUSTER SLOTS/SHARDS report 127.0.0.1 instead of
# an empty address, so cluster clients can follow the topology.
cluster_ports=()
cluster_addrs=()
for i in 1 2 3 4 5 6; do
	start_redis "cluster$i" --cluster-enabled yes --cluster-config-file "$tmp/nodes-@PORT@.conf" \
		--cluster-port @BUSPORT@ --cluster-announce-ip 127.0.0.1 --cluster-node-timeout 5000
	cluster_ports+=("$port")
	cluster_addrs+=("127.0.0.1:$port")
done
# redis-cli makes the first three primaries, splits the slots between them
# and gives each a replica (it warns that primary and replica share a host:
# on loopback they must). It waits for the nodes to agree in steps of a
# second, so it runs while the Sentinels and Postgres start.
timeout 60 redis-cli --cluster create "${cluster_addrs[@]}" --cluster-replicas 1 --cluster-yes \
	>"$tmp/cluster-create.log" 2>&1 </dev/null &
cluster_create_pid=$!

# cluster_ready: every node sees six nodes and cluster_state:ok, and every
# node is a primary with its replica or a replica in sync with its primary.
cluster_ready() {
	local p info
	for p in "${cluster_ports[@]}"; do
		info=$(redis_cli "$p" cluster info 2>&1 || true)
		[[ "$info" == *cluster_state:ok* && "$info" == *cluster_known_nodes:6* ]] || return 1
		info=$(redis_cli "$p" info replication 2>&1 || true)
		[[ "$info" == *role:master*connected_slaves:1* ||
			( "$info" == *role:slave* && "$info" == *master_link_status:up* && "$info" == *master_sync_in_progress:0* ) ]] || return 1
	done
}

# --- Sentinel group: a primary, its replica, three Sentinels --------------------

sentinel_master=batchmr
start_redis sentinel-primary
sentinel_primary_port=$port
start_redis sentinel-replica --replicaof 127.0.0.1 "$sentinel_primary_port"
sentinel_replica_port=$port
# The Sentinels learn the replicas from the primary's INFO, at once when they
# connect and then only every ten seconds: start them once the replica is in.
for i in $(seq 1 300); do
	out=$(redis_cli "$sentinel_replica_port" info replication 2>&1 || true)
	[[ "$out" == *master_link_status:up* ]] && break
	if [[ $i -eq 300 ]]; then
		echo "$out" >&2
		die "the replica 127.0.0.1:$sentinel_replica_port did not sync with 127.0.0.1:$sentinel_primary_port within 30s"
	fi
	sleep 0.1
done
sentinel_ports=()
for i in 1 2 3; do
	printf '%s\n' "sentinel monitor $sentinel_master 127.0.0.1 $sentinel_primary_port 2" \
		"sentinel down-after-milliseconds $sentinel_master 10000" \
		"sentinel failover-timeout $sentinel_master 5000" >"$tmp/sentinel$i.conf"
	start_redis "sentinel$i" "$tmp/sentinel$i.conf" --sentinel
	sentinel_ports+=("$port")
done

# sentinels_ready: every Sentinel monitors the primary as up, with its replica
# and the other two Sentinels. (They find each other through hello messages
# every two seconds, so this is checked after Postgres has started.)
sentinels_ready() {
	local p m
	for p in "${sentinel_ports[@]}"; do
		# SENTINEL MASTER answers names and values on alternate lines.
		m=$(redis_cli "$p" sentinel master "$sentinel_master" 2>/dev/null | tr -d '\r' |
			awk 'NR % 2 == 1 { k = $0; next } { printf " %s=%s", k, $0 } END { print " " }' || true)
		[[ "$m" == *" flags=master "* && "$m" == *" num-slaves=1 "* && "$m" == *" num-other-sentinels=2 "* ]] || return 1
	done
}

# --- Postgres -------------------------------------------------------------------

if ! wait "$initdb_pid"; then
	initdb_pid=""
	cat "$tmp/initdb.log" >&2
	die "initdb failed (log above)"
fi
initdb_pid=""

for _ in 1 2 3 4 5; do
	pick_port
	pg_port=$port
	: >"$tmp/pg.log"
	# Durability is pointless for a throwaway server and fsync is slow.
	if as_pg "$pg_bin/pg_ctl" start -w -t 60 -D "$tmp/pgdata" -l "$tmp/pg.log" \
		-o "-p $pg_port -k $tmp/pgsock -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
		>/dev/null 2>&1; then
		pg_running=1
		break
	fi
	if [[ -f "$tmp/pgdata/postmaster.pid" ]] || ! grep -qi 'address already in use\|could not bind' "$tmp/pg.log"; then
		cat "$tmp/pg.log" >&2
		die "postgres did not start on 127.0.0.1:$pg_port (log above)"
	fi
	say "port $pg_port was taken, retrying postgres on another"
done
[[ $pg_running -eq 1 ]] || die "postgres could not get a free port"

# A full conninfo string, so stray PG* variables in the caller's environment
# (PGSSLMODE, PGSERVICE, ...) can't redirect or break this.
"$psql_bin" -X -q -v ON_ERROR_STOP=1 \
	-d "host=127.0.0.1 port=$pg_port user=postgres dbname=postgres sslmode=disable connect_timeout=10" \
	-c 'CREATE DATABASE batchmr_test' >/dev/null ||
	die "could not create database batchmr_test"

# --- Wait for the Cluster and the Sentinels ------------------------------------

if ! wait "$cluster_create_pid"; then
	cluster_create_pid=""
	cat "$tmp/cluster-create.log" >&2
	die "redis-cli --cluster create ${cluster_addrs[*]} failed (output above)"
fi
cluster_create_pid=""
for i in $(seq 1 300); do
	cluster_ready && break
	if [[ $i -eq 300 ]]; then
		for p in "${cluster_ports[@]}"; do
			redis_cli "$p" cluster nodes >&2 || true
		done
		die "the redis cluster ${cluster_addrs[*]} was not ok with every replica in sync within 30s"
	fi
	sleep 0.1
done
for i in $(seq 1 300); do
	sentinels_ready && break
	if [[ $i -eq 300 ]]; then
		for p in "${sentinel_ports[@]}"; do
			redis_cli "$p" sentinel master "$sentinel_master" >&2 || true
		done
		die "the sentinels on ports ${sentinel_ports[*]} did not all see the primary, its replica and each other within 30s"
	fi
	sleep 0.1
done

# --- Run the command ------------------------------------------------------------

export BATCHMR_TEST_REDIS_URL="redis://127.0.0.1:$redis_standalone_port/0"
export BATCHMR_TEST_REDIS_CLUSTER_ADDRS
BATCHMR_TEST_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${cluster_addrs[*]}")
export BATCHMR_TEST_REDIS_SENTINEL_URL="redis://127.0.0.1:${sentinel_ports[0]}/0?master_name=$sentinel_master&addr=127.0.0.1:${sentinel_ports[1]}&addr=127.0.0.1:${sentinel_ports[2]}"
export BATCHMR_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/batchmr_test?sslmode=disable"
say "redis :$redis_standalone_port, cluster :${cluster_ports[*]}, sentinels :${sentinel_ports[*]} (primary :$sentinel_primary_port), postgres :$pg_port"

# Not exec: we still have to tear the servers down afterwards. In the
# background, because bash runs a trap only once a foreground command ends:
# a TERM sent to this script alone stops the command and the servers at once.
# The command keeps our stdin, and gets back the INT and QUIT that bash
# ignores in background commands, so Ctrl-C still stops it.
cmd_started=1
default_signals=()
if env --default-signal=INT,QUIT true 2>/dev/null; then
	# shellcheck disable=SC2054 # one argument: env takes a list of signals
	default_signals=(env --default-signal=INT,QUIT)
fi
"${default_signals[@]}" "$@" <&0 &
cmd_pid=$!
status=0
wait "$cmd_pid" || status=$?
cmd_pid=""
exit "$status"
