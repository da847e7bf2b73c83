#!/usr/bin/env bash
# Local PostgreSQL + Kafka for promoflow's tests, without Docker.
#
#   scripts/stack.sh up [postgres|pgbouncer|kafka|kafka:N|controller:N]...
#                             start what is not running yet (idempotent); the last
#                             lines on stdout are the export lines, so callers can
#                             eval "$(scripts/stack.sh up)"; kafka:N is broker N
#                             alone, controller:N controller N
#   scripts/stack.sh env      print only the export lines
#   scripts/stack.sh fetch    fetch the Kafka jars once (the tests start a TLS/SASL
#                             broker of their own from them) and print
#                             export PROMOFLOW_KAFKA_LIBS=<folder>
#   scripts/stack.sh status   say what runs (exit 0 if both run, 3 otherwise)
#   scripts/stack.sh down [postgres|pgbouncer|kafka|kafka:N|controller:N]...
#                             stop Kafka, PgBouncer and PostgreSQL cleanly (or only
#                             those named)
#   scripts/stack.sh kill kafka:N|controller:N...
#                             kill -9 Kafka broker N or controller N (fault tests)
#   scripts/stack.sh kill postgres
#                             stop PostgreSQL as a crash would (pg_ctl -m immediate);
#                             `up postgres` then runs crash recovery (fault tests)
#   scripts/stack.sh restart postgres
#                             pg_ctl restart -m fast: every connection is cut, the
#                             server comes back on the same port (fault tests)
#   scripts/stack.sh restart pgbouncer
#                             stop PgBouncer at once (SIGTERM) and start it again
#
# With PROMOFLOW_PGBOUNCER=1 (or "up pgbouncer"), "up" of postgres also starts
# Debian's PgBouncer in transaction pooling in front of PostgreSQL (installed
# when missing), and the export lines point DATABASE_URL at it,
# DATABASE_DIRECT_URL at PostgreSQL (migrations) and turn the consumer's
# prepared statements off, as a process behind a transaction pooler needs
# (docs/runbooks/postgres-connections.md).
#
# Stdout carries only the export lines; every progress message goes to stderr.
# Every service listens on 127.0.0.1 only.
#
# Environment:
#   PROMOFLOW_STACK_DIR              state (data, logs, pid files)  [~/.cache/promoflow/stack]
#   PROMOFLOW_CACHE                  downloaded Kafka jars           [~/.cache/promoflow]
#   PROMOFLOW_PG_PORT                PostgreSQL port                 [25432]
#   PROMOFLOW_PG_SYNCHRONOUS_COMMIT  on: a commit is on disk (the OS's
#                                    cache) before it is answered, so a
#                                    server crash keeps it             [off]
#   PROMOFLOW_KAFKA_NODES            Kafka brokers: 1 is one KRaft node,
#                                    broker and controller; more are
#                                    brokers beside a controller quorum
#                                    (see "nodes" below)             [1]
#   PROMOFLOW_KAFKA_CONTROLLERS      controllers of that quorum      [3]
#   PROMOFLOW_KAFKA_PORT             Kafka port of broker 1;
#                                    broker N: + 2(N-1)              [29092]
#   PROMOFLOW_KAFKA_CONTROLLER_PORT  KRaft controller port (of
#                                    controller 1; K: + 2(K-1))      [29093]
#   PROMOFLOW_KAFKA_HEAP             each broker's -Xmx              [768m; 512m from 3 brokers]
#   PROMOFLOW_KAFKA_CONTROLLER_HEAP  each controller's -Xmx          [256m]
#   PROMOFLOW_KAFKA_PROXIED          1: each node also has a listener
#                                    advertised at a proxy's address
#                                    (see node_proxied_port)         [0]
#   PROMOFLOW_KAFKA_PROXIED_PORT     that listener, node N: + N-1    [KAFKA_PORT + 2 × nodes]
#   PROMOFLOW_KAFKA_PROXY_PORT       its advertised port, + N-1      [KAFKA_PORT + 3 × nodes]
#   PROMOFLOW_PG_DIR                 PostgreSQL folder (see pg_dir)  [computed]
#   PROMOFLOW_KAFKA_READY_TIMEOUT    seconds to wait for Kafka       [120]
#   PROMOFLOW_PGBOUNCER              1: PgBouncer before PostgreSQL  [0]
#   PROMOFLOW_PGBOUNCER_PORT         PgBouncer port                  [26432]
#   PROMOFLOW_PGBOUNCER_POOL_SIZE    server connections per database [20]
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KAFKA_POM=$SCRIPT_DIR/kafka/pom.xml
KAFKA_LOG4J=$SCRIPT_DIR/kafka/log4j2.yaml

# HOME can be missing in stripped-down CI environments.
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"

# The pom is the single source of truth for the Kafka version.
KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_POM")
STATE_DIR=${PROMOFLOW_STACK_DIR:-$HOME/.cache/promoflow/stack}
CACHE_DIR=${PROMOFLOW_CACHE:-$HOME/.cache/promoflow}
# Absolute paths: they end up in pid checks and in the postgres user's commands.
[[ $STATE_DIR == /* ]] || STATE_DIR=$PWD/$STATE_DIR
[[ $CACHE_DIR == /* ]] || CACHE_DIR=$PWD/$CACHE_DIR
KAFKA_LIBS=$CACHE_DIR/kafka-$KAFKA_VERSION/libs
# Default ports sit below Linux's ephemeral range (32768-60999), so that no
# client connection of a test run can hold them when a server starts.
PG_PORT=${PROMOFLOW_PG_PORT:-25432}
PG_SYNCHRONOUS_COMMIT=${PROMOFLOW_PG_SYNCHRONOUS_COMMIT:-off}
[[ $PG_SYNCHRONOUS_COMMIT == on || $PG_SYNCHRONOUS_COMMIT == off ]] ||
	{ echo "stack: ERROR: PROMOFLOW_PG_SYNCHRONOUS_COMMIT is on or off, not $PG_SYNCHRONOUS_COMMIT" >&2; exit 2; }
KAFKA_PORT=${PROMOFLOW_KAFKA_PORT:-29092}
KAFKA_CONTROLLER_PORT=${PROMOFLOW_KAFKA_CONTROLLER_PORT:-29093}
KAFKA_NODES=${PROMOFLOW_KAFKA_NODES:-1}
[[ $KAFKA_NODES =~ ^[1-9]$ ]] || { printf 'stack: ERROR: PROMOFLOW_KAFKA_NODES must be 1..9\n' >&2; exit 1; }
# Three brokers at 512m each fit beside everything else on an 8 GB machine.
KAFKA_HEAP=${PROMOFLOW_KAFKA_HEAP:-$((KAFKA_NODES >= 3 ? 512 : 768))m}
KAFKA_CONTROLLERS=${PROMOFLOW_KAFKA_CONTROLLERS:-3}
KAFKA_CONTROLLER_HEAP=${PROMOFLOW_KAFKA_CONTROLLER_HEAP:-256m}
KAFKA_PROXIED=${PROMOFLOW_KAFKA_PROXIED:-0}
KAFKA_PROXIED_PORT=${PROMOFLOW_KAFKA_PROXIED_PORT:-$((KAFKA_PORT + 2 * KAFKA_NODES))}
KAFKA_PROXY_PORT=${PROMOFLOW_KAFKA_PROXY_PORT:-$((KAFKA_PORT + 3 * KAFKA_NODES))}
PGBOUNCER=${PROMOFLOW_PGBOUNCER:-0}
PGBOUNCER_PORT=${PROMOFLOW_PGBOUNCER_PORT:-26432}
PGBOUNCER_POOL_SIZE=${PROMOFLOW_PGBOUNCER_POOL_SIZE:-20}
HOST=127.0.0.1
KAFKA_DIR=$STATE_DIR/kafka
KAFKA_READY_TIMEOUT=${PROMOFLOW_KAFKA_READY_TIMEOUT:-120}
# KafkaRaftServer logs this once the broker is unfenced and serving
# (kafka.server.KafkaBroker.STARTED_MESSAGE in 4.x).
KAFKA_STARTED_MSG='Kafka Server started'

log() { printf 'stack: %s\n' "$*" >&2; }
die() { printf 'stack: ERROR: %s\n' "$*" >&2; exit 1; }

is_root() { [[ $(id -u) -eq 0 ]]; }

# kill -0 also succeeds for a zombie (our init may be slow to reap), so read
# the process state instead.
pid_alive() {
	local state
	state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
	[[ -n $state && $state != Z ]]
}

# env_lines [pg] [kafka]: the export lines of the named services (default both).
env_lines() {
	local pg=${1:-1} kafka=${2:-1}
	local direct=postgres://postgres@$HOST:$PG_PORT/postgres?sslmode=disable
	if ((pg)) && [[ $PGBOUNCER == 1 ]]; then
		echo "export DATABASE_URL=postgres://postgres@$HOST:$PGBOUNCER_PORT/postgres?sslmode=disable"
		echo "export DATABASE_DIRECT_URL=$direct"
		echo "export DATABASE_PREPARED_STATEMENTS=false"
	elif ((pg)); then
		echo "export DATABASE_URL=$direct"
	fi
	if ((kafka)); then
		echo "export KAFKA_BROKERS=$(kafka_brokers)"
		# For the fault suite: where its proxy listens, and where it forwards to.
		if [[ $KAFKA_PROXIED == 1 ]]; then echo "export KAFKA_PROXY_ROUTES=$(kafka_proxy_routes)"; fi
	fi
}

# services "$@" sets want_pg and want_kafka from service names (none: both).
# "pgbouncer" wants PgBouncer alone (down) or with PostgreSQL (up), whatever
# PROMOFLOW_PGBOUNCER says; want_pgb is set for it. "kafka:N" wants Kafka node
# N and "controller:N" its controller N (kafka_nodes lists their ids; empty:
# every node).
services() {
	want_pg=1 want_kafka=1 want_pgb=0 kafka_nodes=()
	if (($#)); then
		want_pg=0 want_kafka=0
		local s
		for s in "$@"; do
			case $s in
			postgres | postgresql) want_pg=1 ;;
			pgbouncer) want_pgb=1 PGBOUNCER=1 ;;
			kafka) want_kafka=1 ;;
			kafka:[1-9]) want_kafka=1 kafka_nodes+=("${s#kafka:}") ;;
			controller:[1-9]) want_kafka=1 kafka_nodes+=($((100 + ${s#controller:}))) ;;
			*) die "unknown service: $s (postgres, pgbouncer, kafka, kafka:N or controller:N)" ;;
			esac
		done
	fi
}

# True if something accepts TCP connections on 127.0.0.1:$1.
port_open() {
	timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

apt_install() {
	is_root || die "missing packages ($*) and not root: install them first"
	log "installing $* with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq "$@" >&2
}

# Serialise concurrent up/down calls on the same state dir. Children started
# while holding it must close fd 9, or they would keep the lock forever.
take_lock() {
	mkdir -p "$STATE_DIR"
	exec 9>"$STATE_DIR/.lock"
	if ! flock -w 300 9; then
		die "another stack.sh holds $STATE_DIR/.lock"
	fi
}

# ---------------------------------------------------------------- PostgreSQL

# Server binaries: the version that created an existing cluster wins (a major
# upgrade could not start it), then pg_config, then the newest installed.
pg_bindir() {
	local data=$1 d ver
	if [[ -f $data/PG_VERSION ]]; then
		ver=$(<"$data/PG_VERSION")
		d=/usr/lib/postgresql/$ver/bin
		[[ -x $d/initdb ]] && { echo "$d"; return 0; }
	fi
	if d=$(pg_config --bindir 2>/dev/null) && [[ -x $d/initdb ]]; then
		echo "$d"
		return 0
	fi
	d=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null |
		sort -V | tail -n 1)
	[[ -n $d && -x $d/initdb ]] || return 1
	echo "$d"
}

# PostgreSQL refuses to run as root, so as root it runs as the postgres user,
# which must be able to reach its folder. $HOME (/root) is usually mode 700;
# in that case the cluster lives under /var/tmp, in a folder named after the
# state dir, and $STATE_DIR/pg is a symlink to it (for people only: the
# postgres user cannot follow it through /root).
pg_dir() {
	if [[ -n ${PROMOFLOW_PG_DIR:-} ]]; then
		echo "$PROMOFLOW_PG_DIR"
	elif ! is_root ||
		{ [[ -d $STATE_DIR ]] && runuser -u postgres -- test -x "$STATE_DIR" 2>/dev/null; }; then
		echo "$STATE_DIR/pg"
	else
		echo "/var/tmp/promoflow-pg-$(printf '%s' "$STATE_DIR" | cksum | cut -d' ' -f1)"
	fi
}

# Run a PostgreSQL binary as the postgres user when we are root; fd 9 (the
# lock) is closed so the postmaster does not inherit it.
as_pg() {
	if is_root; then
		runuser -u postgres -- "$@" 9>&-
	else
		"$@" 9>&-
	fi
}

# pg_ctl status alone would also count a killed, not yet reaped postmaster.
pg_running() {
	local dir bindir pid
	dir=$(pg_dir)
	[[ -f $dir/data/postmaster.pid ]] || return 1
	pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] && pid_alive "$pid" || return 1
	bindir=$(pg_bindir "$dir/data") || return 1
	as_pg "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1
}

pg_up() {
	local dir data bindir
	if ! pg_bindir "" >/dev/null; then
		apt_install postgresql
	fi
	dir=$(pg_dir)
	data=$dir/data
	mkdir -p "$dir"
	if [[ $dir != "$STATE_DIR/pg" && ! -e $STATE_DIR/pg ]]; then
		ln -s "$dir" "$STATE_DIR/pg"
	fi
	if is_root; then
		chown postgres: "$dir"
		chmod 700 "$dir"
	fi
	bindir=$(pg_bindir "$data") || die "no PostgreSQL server binaries found"

	if pg_running; then
		log "PostgreSQL already running ($data)"
	else
		if port_open "$PG_PORT"; then
			die "port $PG_PORT is in use by another process; stop it or set PROMOFLOW_PG_PORT"
		fi
		if [[ ! -f $data/PG_VERSION ]]; then
			# initdb into a temp folder and rename, so an interrupted run
			# never leaves a half-made cluster behind.
			log "initdb $data"
			rm -rf "$data.tmp"
			as_pg "$bindir/initdb" -D "$data.tmp" -A trust -U postgres \
				-E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
				{ cat "$dir/initdb.log" >&2; die "initdb failed"; }
			mv "$data.tmp" "$data"
		fi
		log "starting PostgreSQL on $HOST:$PG_PORT"
		# Settings for throwaway test data: no durability (a commit survives a
		# server crash only with PROMOFLOW_PG_SYNCHRONOUS_COMMIT=on; none
		# survives a machine's), many connections.
		# The lock table stays the size of PostgreSQL's default (64 locks ×
		# 100 connections): 21 × 300 = 6300, so a test sees the lock limits
		# production has (handlers/boost asserts it).
		# The unix socket goes to the private folder, not /var/run/postgresql.
		if ! as_pg "$bindir/pg_ctl" -D "$data" -w -t 60 -l "$dir/postgresql.log" \
			-o "-p $PG_PORT -k '$dir' -c listen_addresses=$HOST -c max_connections=300 -c max_locks_per_transaction=21 -c fsync=off -c synchronous_commit=$PG_SYNCHRONOUS_COMMIT -c full_page_writes=off" \
			start >&2; then
			tail -n 30 "$dir/postgresql.log" >&2 || true
			die "PostgreSQL did not start (log: $dir/postgresql.log)"
		fi
	fi
	as_pg "$bindir/pg_isready" -q -h "$HOST" -p "$PG_PORT" ||
		die "PostgreSQL runs but does not answer on $HOST:$PG_PORT"
}

pg_down() {
	local dir bindir
	dir=$(pg_dir)
	if pg_running; then
		bindir=$(pg_bindir "$dir/data")
		log "stopping PostgreSQL"
		as_pg "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >&2
	else
		log "PostgreSQL not running"
	fi
}

# ----------------------------------------------------------------- PgBouncer

# PgBouncer's folder sits in the cluster's, which the postgres user can reach.
pgb_dir() { echo "$(pg_dir)/pgbouncer"; }

pgb_bin() {
	command -v pgbouncer 2>/dev/null || { [[ -x /usr/sbin/pgbouncer ]] && echo /usr/sbin/pgbouncer; }
}

pgb_pid() {
	local pid file
	file=$(pgb_dir)/pgbouncer.pid
	[[ -f $file ]] || return 1
	pid=$(<"$file")
	[[ $pid =~ ^[0-9]+$ ]] && pid_alive "$pid" || return 1
	echo "$pid"
}

pgb_up() {
	local dir bin pid i
	if pid=$(pgb_pid); then
		log "PgBouncer already running (pid $pid)"
		return 0
	fi
	bin=$(pgb_bin) || {
		apt_install pgbouncer
		bin=$(pgb_bin)
	}
	if port_open "$PGBOUNCER_PORT"; then
		die "port $PGBOUNCER_PORT is in use by another process; stop it or set PROMOFLOW_PGBOUNCER_PORT"
	fi
	dir=$(pgb_dir)
	mkdir -p "$dir"
	# Transaction pooling, as production runs it. Clients on 127.0.0.1 are
	# trusted; the server side logs in as postgres.
	echo '"postgres" ""' >"$dir/users.txt"
	cat >"$dir/pgbouncer.ini" <<EOF
; Generated by scripts/stack.sh on every start; edit the script, not this file.
[databases]
* = host=$HOST port=$PG_PORT user=postgres

[pgbouncer]
listen_addr = $HOST
listen_port = $PGBOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
default_pool_size = $PGBOUNCER_POOL_SIZE
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
	if is_root; then chown -R postgres: "$dir"; fi
	log "starting PgBouncer on $HOST:$PGBOUNCER_PORT (transaction pooling, pool $PGBOUNCER_POOL_SIZE)"
	as_pg "$bin" -d "$dir/pgbouncer.ini" >&2 || die "PgBouncer did not start (log: $dir/pgbouncer.log)"
	for ((i = 0; i < 100; i++)); do
		port_open "$PGBOUNCER_PORT" && return 0
		sleep 0.1
	done
	die "PgBouncer does not answer on $HOST:$PGBOUNCER_PORT (log: $dir/pgbouncer.log)"
}

# SIGTERM: PgBouncer exits at once, cutting every connection.
pgb_down() {
	local pid
	if pid=$(pgb_pid); then
		log "stopping PgBouncer (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		while pid_alive "$pid"; do sleep 0.1; done
	fi
}

# --------------------------------------------------------------------- Kafka

java_bin() {
	if [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
		echo "$JAVA_HOME/bin/java"
	else
		command -v java
	fi
}

# Fetch the broker jars once. They are copied to a temp folder that is renamed
# into place only when complete, so an interrupted download is retried.
kafka_fetch() {
	local tmp
	if [[ -f $KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar ]]; then
		return 0
	fi
	local missing=()
	command -v java >/dev/null || [[ -n ${JAVA_HOME:-} ]] || missing+=(openjdk-17-jre-headless)
	command -v mvn >/dev/null || missing+=(maven)
	if ((${#missing[@]})); then
		apt_install "${missing[@]}"
	fi
	log "downloading Kafka $KAFKA_VERSION jars to $KAFKA_LIBS (once)"
	mkdir -p "$(dirname "$KAFKA_LIBS")"
	tmp=$(mktemp -d "$KAFKA_LIBS.tmp.XXXXXX")
	if ! mvn -B -q -f "$KAFKA_POM" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$tmp" >&2; then
		rm -rf "$tmp"
		die "mvn could not fetch Kafka $KAFKA_VERSION"
	fi
	if [[ ! -f $tmp/kafka_2.13-$KAFKA_VERSION.jar ]]; then
		rm -rf "$tmp"
		die "kafka_2.13-$KAFKA_VERSION.jar missing after mvn copy-dependencies"
	fi
	rm -rf "$KAFKA_LIBS"
	mv "$tmp" "$KAFKA_LIBS"
}

# ---- nodes
# One node (PROMOFLOW_KAFKA_NODES=1) is broker and controller at once, id 1.
# From two on, the brokers (ids 1..KAFKA_NODES, process.roles=broker) and a
# quorum of KAFKA_CONTROLLERS controllers (ids 101.., process.roles=
# controller) are separate processes, as production runs them: the quorum
# keeps a majority while brokers die, so the cluster can still shrink ISRs
# and refuse writes with NOT_ENOUGH_REPLICAS, and losing the active
# controller loses no broker.
#
# Broker n listens on KAFKA_PORT + 2(n-1); controller k (id 100+k) on
# KAFKA_CONTROLLER_PORT + 2(k-1), the single node on KAFKA_CONTROLLER_PORT.
# Broker 1 keeps the folder $STATE_DIR/kafka, broker n $STATE_DIR/kafka-n,
# controller k $STATE_DIR/kafka-controller-k.
is_controller() { (($1 > 100)); }
node_dir() {
	if (($1 == 1)); then
		echo "$KAFKA_DIR"
	elif is_controller "$1"; then
		echo "$STATE_DIR/kafka-controller-$(($1 - 100))"
	else
		echo "$STATE_DIR/kafka-$1"
	fi
}
node_port() { echo $((KAFKA_PORT + 2 * ($1 - 1))); }
node_controller_port() {
	if is_controller "$1"; then echo $((KAFKA_CONTROLLER_PORT + 2 * ($1 - 101))); else echo "$KAFKA_CONTROLLER_PORT"; fi
}
# The port that says a node is up: a broker's client port, a controller's port.
node_ready_port() { if is_controller "$1"; then node_controller_port "$1"; else node_port "$1"; fi; }
node_name() {
	if ((KAFKA_NODES == 1)); then
		echo "kafka"
	elif is_controller "$1"; then
		echo "kafka controller $(($1 - 100))"
	else
		echo "kafka broker $1"
	fi
}
# With PROMOFLOW_KAFKA_PROXIED=1, broker n also has a listener PROXIED on
# KAFKA_PROXIED_PORT + n-1 that it advertises at KAFKA_PROXY_PORT + n-1: a
# process whose bootstrap servers are the proxy ports reaches every broker
# through whatever listens there (the fault suite's proxy), and the
# metadata it gets names only proxy ports.
node_proxied_port() { echo $((KAFKA_PROXIED_PORT + $1 - 1)); }
node_proxy_port() { echo $((KAFKA_PROXY_PORT + $1 - 1)); }
brokers() { seq 1 "$KAFKA_NODES"; }
controllers() { if ((KAFKA_NODES > 1)); then seq 101 $((100 + KAFKA_CONTROLLERS)); fi; }
all_nodes() { controllers; brokers; }

# The brokers' client addresses, comma-separated.
kafka_brokers() {
	local n out=()
	for n in $(brokers); do out+=("$HOST:$(node_port "$n")"); done
	(IFS=,; echo "${out[*]}")
}

# proxy=upstream pairs of the PROXIED listeners, comma-separated.
kafka_proxy_routes() {
	local n out=()
	for n in $(brokers); do out+=("$HOST:$(node_proxy_port "$n")=$HOST:$(node_proxied_port "$n")"); done
	(IFS=,; echo "${out[*]}")
}

kafka_voters() {
	local n out=()
	for n in $(controllers); do out+=("$n@$HOST:$(node_controller_port "$n")"); done
	(IFS=,; echo "${out[*]}")
}

# Pid of node $1 if it runs. The command line is checked too, so a stale
# pid file whose number was reused by another process is not trusted.
kafka_pid() {
	local pid dir
	dir=$(node_dir "$1")
	[[ -f $dir/kafka.pid ]] || return 1
	pid=$(<"$dir/kafka.pid")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	pid_alive "$pid" || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $dir/server.properties" || return 1
	echo "$pid"
}

# What a node's storage was formatted for: another value means the data dir
# belongs to another cluster shape and is wiped (it is test data).
kafka_shape() {
	if ((KAFKA_NODES == 1)); then
		echo "$HOST:$KAFKA_CONTROLLER_PORT"
	else
		echo "brokers=$KAFKA_NODES voters=$(kafka_voters)"
	fi
}

kafka_write_config() {
	local n=$1 dir port cport roles listeners advertised protocols quorum rf isr
	dir=$(node_dir "$n")
	cport=$(node_controller_port "$n")
	protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
	if ((KAFKA_NODES == 1)); then
		port=$(node_port "$n")
		roles=broker,controller
		listeners="PLAINTEXT://$HOST:$port,CONTROLLER://$HOST:$cport"
		advertised=$listeners
		# Dynamic quorum (KIP-853), formatted with --standalone.
		quorum="controller.quorum.bootstrap.servers=$HOST:$cport"
	elif is_controller "$n"; then
		roles=controller
		listeners="CONTROLLER://$HOST:$cport"
		advertised=$listeners
		quorum="controller.quorum.voters=$(kafka_voters)"
	else
		port=$(node_port "$n")
		roles=broker
		listeners="PLAINTEXT://$HOST:$port"
		advertised=$listeners
		quorum="controller.quorum.voters=$(kafka_voters)"
	fi
	if [[ $KAFKA_PROXIED == 1 && $roles == *broker* ]]; then
		listeners+=",PROXIED://$HOST:$(node_proxied_port "$n")"
		advertised+=",PROXIED://$HOST:$(node_proxy_port "$n")"
		protocols+=",PROXIED:PLAINTEXT"
	fi
	# Internal topics: every replica of a one-broker cluster, three (two in
	# sync for a write) from three brokers on, as production runs them.
	rf=$((KAFKA_NODES < 3 ? KAFKA_NODES : 3))
	isr=$((rf < 3 ? 1 : 2))
	cat >"$dir/server.properties" <<EOF
# Generated by scripts/stack.sh on every start; edit the script, not this file.
# $(node_name "$n") of a KRaft cluster of $KAFKA_NODES broker(s), for tests only.
process.roles=$roles
node.id=$n
listeners=$listeners
advertised.listeners=$advertised
listener.security.protocol.map=$protocols
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
$quorum
log.dirs=$dir/data

default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
# Few internal partitions: faster first consumer group / transaction.
offsets.topic.num.partitions=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.num.partitions=1

# Test-friendly behaviour.
auto.create.topics.enable=true
delete.topic.enable=true
num.partitions=1
group.initial.rebalance.delay.ms=0
EOF
	# A controller-only node rejects the broker settings above.
	if is_controller "$n"; then
		sed -i '/^inter.broker.listener.name=/d' "$dir/server.properties"
	fi
}

# A Kafka UUID (base64url of 16 random bytes, no padding); like
# kafka.tools.StorageTool random-uuid, but without starting a JVM.
kafka_random_uuid() {
	local id
	while :; do
		id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
		[[ $id != -* ]] && break
	done
	echo "$id"
}

kafka_tail_logs() {
	local f dir
	dir=$(node_dir "$1")
	for f in "$dir/logs/server.log" "$dir/kafka.out"; do
		if [[ -s $f ]]; then
			printf -- '--- last lines of %s ---\n' "$f" >&2
			tail -n 40 "$f" >&2
		fi
	done
}

kafka_ready() {
	port_open "$(node_ready_port "$1")" &&
		grep -qF "$KAFKA_STARTED_MSG" "$(node_dir "$1")/logs/server.log" 2>/dev/null
}

# Wait until node $1's port accepts connections and its log says the server
# started (the port opens before the broker has joined the quorum).
kafka_wait_ready() {
	local n=$1 pid=$2 deadline=$((SECONDS + KAFKA_READY_TIMEOUT))
	until kafka_ready "$n"; do
		if ! pid_alive "$pid"; then
			kafka_tail_logs "$n"
			die "$(node_name "$n") exited during startup (logs in $(node_dir "$n"))"
		fi
		if ((SECONDS >= deadline)); then
			kafka_tail_logs "$n"
			kafka_stop "$n" "$pid"
			die "$(node_name "$n") not ready on $HOST:$(node_ready_port "$n") after ${KAFKA_READY_TIMEOUT}s (logs in $(node_dir "$n"))"
		fi
		sleep 0.5
	done
}

# The storage of every node is formatted together, with one cluster id, when
# any of them lacks it or was formatted for another shape.
kafka_format() {
	local java=$1 n dir cluster_id shape fresh=0
	shift
	shape=$(kafka_shape)
	for n in $(all_nodes); do
		dir=$(node_dir "$n")
		if [[ ! -f $dir/data/meta.properties || $(cat "$dir/formatted-for" 2>/dev/null || true) != "$shape" ]]; then
			fresh=1
		fi
	done
	((fresh)) || return 0
	for n in $(all_nodes); do
		if kafka_pid "$n" >/dev/null; then
			die "$(node_name "$n") runs on storage of another shape; stop it first (stack.sh down kafka)"
		fi
	done
	cluster_id=$(kafka_random_uuid)
	log "formatting Kafka storage of $(all_nodes | wc -l) node(s) (cluster id $cluster_id)"
	local standalone=() pids=()
	((KAFKA_NODES > 1)) || standalone=(--standalone)
	for n in $(all_nodes); do
		dir=$(node_dir "$n")
		rm -rf "$dir/data" "$dir/formatted-for"
		"$java" "$@" -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format \
			"${standalone[@]}" -t "$cluster_id" -c "$dir/server.properties" >&2 9>&- &
		pids+=("$n:$!")
	done
	local entry
	for entry in "${pids[@]}"; do
		n=${entry%%:*}
		wait "${entry#*:}" || die "kafka-storage format of $(node_name "$n") failed"
		echo "$shape" >"$(node_dir "$n")/formatted-for"
	done
}

# kafka_up [node...]: start the named nodes (default: all) that do not run,
# and wait until each is ready.
kafka_up() {
	local java n p dir pid heap nodes=("$@") started=()
	((${#nodes[@]})) || mapfile -t nodes < <(all_nodes)
	kafka_fetch
	java=$(java_bin) || die "java not found"
	for n in $(all_nodes); do
		dir=$(node_dir "$n")
		mkdir -p "$dir/logs"
		kafka_pid "$n" >/dev/null || kafka_write_config "$n"
		# Outside the repo, so a running broker never depends on the checkout.
		cp "$KAFKA_LOG4J" "$dir/log4j2.yaml"
	done
	kafka_format "$java" -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.yaml" -Dkafka.logs.dir="$KAFKA_DIR/logs" -Djava.awt.headless=true
	for n in "${nodes[@]}"; do
		if pid=$(kafka_pid "$n"); then
			log "$(node_name "$n") already running (pid $pid)"
			started+=("$n:$pid")
			continue
		fi
		for p in "$(node_ready_port "$n")" "$(node_controller_port "$n")"; do
			if ((KAFKA_NODES == 1 || p == $(node_ready_port "$n"))) && port_open "$p"; then
				die "port $p is in use by another process; stop it or set PROMOFLOW_KAFKA_PORT/PROMOFLOW_KAFKA_CONTROLLER_PORT"
			fi
		done
		dir=$(node_dir "$n")
		# Keep the previous run's log so the readiness check only sees this run.
		if [[ -f $dir/logs/server.log ]]; then
			mv -f "$dir/logs/server.log" "$dir/logs/server.log.prev"
		fi
		heap=$KAFKA_HEAP
		is_controller "$n" && heap=$KAFKA_CONTROLLER_HEAP
		log "starting Kafka $KAFKA_VERSION, $(node_name "$n"), on $HOST:$(node_ready_port "$n")"
		# setsid + nohup: the broker outlives this script and its terminal; all of
		# its output goes to files so "$(stack.sh up)" does not wait for it.
		setsid nohup "$java" -Xmx"$heap" -XX:+UseG1GC \
			-Dlog4j2.configurationFile="$dir/log4j2.yaml" -Dkafka.logs.dir="$dir/logs" -Djava.awt.headless=true \
			-cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties" \
			>"$dir/kafka.out" 2>&1 </dev/null 9>&- &
		echo "$!" >"$dir/kafka.pid"
		started+=("$n:$!")
	done
	# Nodes of a quorum start together: none is ready before a majority runs.
	local t0=$SECONDS entry
	for entry in "${started[@]}"; do
		kafka_wait_ready "${entry%%:*}" "${entry#*:}"
	done
	log "Kafka ready ($(for n in "${nodes[@]}"; do node_name "$n"; done | paste -sd, -)) after $((SECONDS - t0))s"
}

# SIGTERM gives a controlled shutdown; KILL only if it hangs.
kafka_stop() {
	local n=$1 pid=$2 i
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 120; i++)); do
		pid_alive "$pid" || break
		sleep 0.5
	done
	if pid_alive "$pid"; then
		log "$(node_name "$n") did not stop within 60s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		while pid_alive "$pid"; do sleep 0.2; done
	fi
	rm -f "$(node_dir "$n")/kafka.pid"
}

# kafka_down [node...]: stop the named nodes (default: all), in parallel:
# brokers first, then the controllers, which a broker's controlled shutdown
# needs.
kafka_down() {
	local n pid group nodes=("$@") waits
	((${#nodes[@]})) || mapfile -t nodes < <(all_nodes)
	for group in brokers controllers; do
		waits=()
		for n in "${nodes[@]}"; do
			if [[ $group == brokers ]] && is_controller "$n"; then continue; fi
			if [[ $group == controllers ]] && ! is_controller "$n"; then continue; fi
			if pid=$(kafka_pid "$n"); then
				log "stopping $(node_name "$n") (pid $pid)"
				kafka_stop "$n" "$pid" &
				waits+=("$!")
			else
				log "$(node_name "$n") not running"
				rm -f "$(node_dir "$n")/kafka.pid"
			fi
		done
		for pid in "${waits[@]}"; do wait "$pid"; done
	done
}

# kafka_kill node...: kill -9, as a crash would.
kafka_kill() {
	local n pid
	for n in "$@"; do
		pid=$(kafka_pid "$n") || die "$(node_name "$n") is not running"
		log "kill -9 $(node_name "$n") (pid $pid)"
		kill -KILL "$pid"
		while pid_alive "$pid"; do sleep 0.1; done
		rm -f "$(node_dir "$n")/kafka.pid"
	done
}

# ------------------------------------------------------------------ commands

cmd_up() {
	local t0=$SECONDS want_pg want_kafka want_pgb kafka_nodes
	services "$@"
	take_lock
	if ((want_pgb)); then want_pg=1; fi
	if ((want_pg)); then pg_up; fi
	if ((want_pg)) && [[ $PGBOUNCER == 1 ]]; then pgb_up; fi
	if ((want_kafka)); then kafka_up "${kafka_nodes[@]}"; fi
	log "stack up in $((SECONDS - t0))s (state: $STATE_DIR)"
	env_lines "$want_pg" "$want_kafka"
}

cmd_down() {
	local want_pg want_kafka want_pgb kafka_nodes
	services "$@"
	take_lock
	if ((want_kafka)); then kafka_down "${kafka_nodes[@]}"; fi
	if ((want_pg || want_pgb)); then pgb_down; fi
	if ((want_pg)); then pg_down; fi
}

# pg_ctl_running MESSAGE ARGS...: runs pg_ctl against the running server.
pg_ctl_running() {
	local dir bindir msg=$1
	shift
	dir=$(pg_dir)
	pg_running || die "PostgreSQL is not running"
	bindir=$(pg_bindir "$dir/data")
	log "$msg"
	as_pg "$bindir/pg_ctl" -D "$dir/data" -w -t 60 "$@" >&2
}

# pg_ctl restart keeps the options the server was started with.
pg_restart() {
	pg_ctl_running "restarting PostgreSQL (fast)" -m fast -l "$(pg_dir)/postgresql.log" restart
}

# pg_kill: an immediate shutdown, as a crash would leave the server: every
# backend ends at once, nothing is checkpointed, and the next start runs
# crash recovery (which empties unlogged tables).
pg_kill() {
	pg_ctl_running "stopping PostgreSQL as a crash would (immediate)" -m immediate stop
}

cmd_status() {
	local rc=0 pid
	if pg_running; then
		echo "postgresql: running on $HOST:$PG_PORT (data $(pg_dir)/data)"
	else
		echo "postgresql: stopped"
		rc=3
	fi
	if pid=$(pgb_pid); then
		echo "pgbouncer: running on $HOST:$PGBOUNCER_PORT (pid $pid, transaction pooling)"
	elif [[ $PGBOUNCER == 1 ]]; then
		echo "pgbouncer: stopped"
		rc=3
	fi
	local n running=0 name total
	total=$(all_nodes | wc -l)
	for n in $(all_nodes); do
		name=$(node_name "$n")
		if pid=$(kafka_pid "$n"); then
			if kafka_ready "$n"; then
				echo "$name: running on $HOST:$(node_ready_port "$n") (pid $pid, data $(node_dir "$n")/data)"
				running=$((running + 1))
			else
				echo "$name: starting (pid $pid)"
			fi
		else
			echo "$name: stopped"
		fi
	done
	if ((KAFKA_NODES > 1)); then
		if ((running == total)); then echo "kafka: running ($running of $total nodes)"; else echo "kafka: $running of $total nodes running"; fi
	fi
	((running == total)) || rc=3
	return "$rc"
}

case ${1:-} in
up) cmd_up "${@:2}" ;;
down) cmd_down "${@:2}" ;;
restart)
	take_lock
	case ${2:-} in
	postgres) pg_restart ;;
	pgbouncer)
		pgb_down
		pgb_up
		;;
	*) die "restart takes postgres or pgbouncer" ;;
	esac
	;;
kill)
	take_lock
	services "${@:2}"
	if ((want_pg && ${#kafka_nodes[@]} == 0 && $# == 2)); then
		pg_kill
	else
		((!want_pg && ${#kafka_nodes[@]})) || die "kill takes postgres, or kafka:N or controller:N..."
		kafka_kill "${kafka_nodes[@]}"
	fi
	;;
env) env_lines ;;
fetch)
	take_lock
	kafka_fetch
	echo "export PROMOFLOW_KAFKA_LIBS=$KAFKA_LIBS"
	;;
status) cmd_status ;;
*)
	echo "usage: $0 {up [postgres|pgbouncer|kafka|kafka:N|controller:N]...|down [same]...|kill postgres|kafka:N|controller:N...|restart postgres|pgbouncer|env|fetch|status}" >&2
	exit 2
	;;
esac
