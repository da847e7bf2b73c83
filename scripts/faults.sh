#!/usr/bin/env bash
# promoflow's fault-injection suite over the real processes.
#
#   scripts/faults.sh [short|full] [extra go test args...]
#
# short (the default, what CI runs) takes a few minutes; full uses the sizes of
# the scenarios' names (10k due purchases, 10k bad records, 10k bad requests).
# It starts a PostgreSQL and a Kafka cluster of its own (state in
# ~/.cache/promoflow/faults-stack; PostgreSQL on 25442, three brokers on
# 29102/29104/29106 beside three KRaft controllers on 29103/29105/29107, each
# broker's listener for the suite's proxies on 29108-29110, advertised at
# 29111-29113; override with PROMOFLOW_FAULTS_STACK_DIR,
# PROMOFLOW_FAULTS_{PG,KAFKA,KAFKA_CONTROLLER,KAFKA_PROXIED,KAFKA_PROXY}_PORT and
# PROMOFLOW_FAULTS_KAFKA_NODES), because its scenarios kill, stop and restart
# them; installs Debian's prometheus when missing; runs TestFaults
# (go test -tags faults ./scripts/faults; its checker's own test,
# TestChecker_DetectsEachViolation, runs in every go test ./...); prints one
# line per scenario and a final "faults: N passed, N failed" line; and stops
# that stack again.
# Process logs and Prometheus' data go to $FAULTS_LOG_DIR (default: a temp dir).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
FORM=${1:-short}
shift || true
case $FORM in short | full) ;; *) echo "usage: $0 [short|full] [go test args...]" >&2; exit 2 ;; esac

log() { printf 'faults.sh: %s\n' "$*" >&2; }

if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH=$PATH:/usr/local/go/bin
fi
if ! command -v prometheus >/dev/null; then
	[[ $(id -u) -eq 0 ]] || { log "prometheus is missing (apt-get install prometheus)"; exit 1; }
	log "installing prometheus (Debian package)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
fi

export PROMOFLOW_STACK_DIR=${PROMOFLOW_FAULTS_STACK_DIR:-$HOME/.cache/promoflow/faults-stack}
export PROMOFLOW_PG_PORT=${PROMOFLOW_FAULTS_PG_PORT:-25442}
export PROMOFLOW_KAFKA_PORT=${PROMOFLOW_FAULTS_KAFKA_PORT:-29102}
export PROMOFLOW_KAFKA_CONTROLLER_PORT=${PROMOFLOW_FAULTS_KAFKA_CONTROLLER_PORT:-29103}
# Scenarios restart the broker; on a loaded machine a restart can take minutes.
export PROMOFLOW_KAFKA_READY_TIMEOUT=${PROMOFLOW_KAFKA_READY_TIMEOUT:-300}
# Three brokers beside a quorum of three controllers, each broker with a
# listener advertised at the address of the suite's proxy for it.
export PROMOFLOW_KAFKA_NODES=${PROMOFLOW_FAULTS_KAFKA_NODES:-3}
export PROMOFLOW_KAFKA_PROXIED=1
# A crash of PostgreSQL (scenario k) keeps what it answered as committed.
export PROMOFLOW_PG_SYNCHRONOUS_COMMIT=on
[[ -z ${PROMOFLOW_FAULTS_KAFKA_PROXIED_PORT:-} ]] || export PROMOFLOW_KAFKA_PROXIED_PORT=$PROMOFLOW_FAULTS_KAFKA_PROXIED_PORT
[[ -z ${PROMOFLOW_FAULTS_KAFKA_PROXY_PORT:-} ]] || export PROMOFLOW_KAFKA_PROXY_PORT=$PROMOFLOW_FAULTS_KAFKA_PROXY_PORT
unset DATABASE_URL KAFKA_BROKERS KAFKA_PROXY_ROUTES PROMOFLOW_KAFKA_CONTROLLERS PROMOFLOW_KAFKA_HEAP
# Every run starts from empty Kafka storage: the topics of scenarios that
# failed in earlier runs stay on the brokers otherwise, and with thousands of
# partitions a broker of 512 MB heap ends in OutOfMemoryError (seen as every
# transactional publish timing out while the coordinator's broker thrashed).
bash scripts/stack.sh down kafka >/dev/null 2>&1 || true
rm -f "$PROMOFLOW_STACK_DIR"/kafka*/formatted-for
trap 'bash scripts/stack.sh down >/dev/null 2>&1 || log "WARNING: stopping the fault stack failed"' EXIT
stack_env=$(bash scripts/stack.sh up)
eval "$stack_env"
export DATABASE_URL KAFKA_BROKERS KAFKA_PROXY_ROUTES
export FAULTS_LOG_DIR=${FAULTS_LOG_DIR:-$(mktemp -d /tmp/promoflow-faults.XXXXXX)}
mkdir -p "$FAULTS_LOG_DIR"
log "form $FORM; stack $DATABASE_URL $KAFKA_BROKERS; logs in $FAULTS_LOG_DIR"

out=$FAULTS_LOG_DIR/go-test.log
rc=0
go test -tags faults -count=1 -timeout 150m -v -run '^TestFaults$' ./scripts/faults/ -args -faults.form="$FORM" "$@" >"$out" 2>&1 || rc=$?
grep -E '^\s+(faults_test|[a-z_]+_test)\.go:[0-9]+:' "$out" | grep -v 'scenarios_test\.go' | head -n 40 >&2 || true
# Every violation the scenarios recorded (t.Error in scenarios_test.go), however many lines came before.
grep -E '^\s+scenarios_test\.go:[0-9]+:' "$out" | head -n 100 >&2 || true
# The summary the suite printed last: one line per scenario, then the count.
sed -n '/^$/,$p' "$out" | grep -E '^(scenario|faults:)' | tail -n 40
if ((rc != 0)) && ! grep -q '^faults:' "$out"; then
	tail -n 40 "$out" >&2
	echo "faults: the suite did not finish (exit $rc; log $out)"
fi
exit "$rc"
