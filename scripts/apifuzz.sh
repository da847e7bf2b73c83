#!/usr/bin/env bash
# Both HTTP APIs against an independent fuzzer, Schemathesis.
#
#   scripts/apifuzz.sh
#
# 1. installs Schemathesis from PyPI, pinned with all it needs
#    (scripts/apifuzz/requirements.txt), into a virtual environment under the
#    cache folder (python3-venv from Debian when python3 cannot make one), once;
# 2. builds promoflow and starts `promoflow promotion` and `promoflow catalog`
#    on 127.0.0.1 (ports from the kernel) with a database and topics of their
#    own on DATABASE_URL and KAFKA_BROKERS (scripts/stack.sh up when either is
#    unset; the stack is left running), a tenant token and an admin token made
#    up for the run;
# 3. runs `st run` against each process's own /openapi.json: every check,
#    every phase (examples, coverage, fuzzing, stateful), a fixed seed, with
#    scripts/apifuzz/<api>.toml (a warning fails the run too) and the checks
#    of scripts/apifuzz/hooks.py;
# 4. stops both processes, drops the database, prints one line per API and
#    "apifuzz: PASS|FAIL: ..." last, and exits non-zero when Schemathesis
#    found anything (or could not run).
#
# Environment:
#   PROMOFLOW_CACHE                 where the virtual environment lives  [~/.cache/promoflow]
#   PROMOFLOW_APIFUZZ_EXAMPLES      most cases per operation and phase   [500]
#   PROMOFLOW_APIFUZZ_SEED          Schemathesis' seed                   [24]
#   PROMOFLOW_APIFUZZ_LOG_DIR       process logs and Schemathesis' reports [a temp dir]
# The topics (apifuzz.<run>.*, one partition each) stay on the brokers.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
REQUIREMENTS=$ROOT/scripts/apifuzz/requirements.txt
SCHEMATHESIS_VERSION=$(sed -n 's/^schemathesis==//p' "$REQUIREMENTS")
EXAMPLES=${PROMOFLOW_APIFUZZ_EXAMPLES:-500}
SEED=${PROMOFLOW_APIFUZZ_SEED:-24}
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
CACHE_DIR=${PROMOFLOW_CACHE:-$HOME/.cache/promoflow}
[[ $CACHE_DIR == /* ]] || CACHE_DIR=$PWD/$CACHE_DIR
VENV=$CACHE_DIR/schemathesis-$SCHEMATHESIS_VERSION

log() { printf 'apifuzz.sh: %s\n' "$*" >&2; }
die() { printf 'apifuzz.sh: ERROR: %s\n' "$*" >&2; exit 1; }

if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH=$PATH:/usr/local/go/bin
fi
command -v go >/dev/null || die "go not found (expected on PATH or in /usr/local/go/bin)"

# apt_install installs Debian packages, as root only.
apt_install() {
	[[ $(id -u) -eq 0 ]] || die "$* missing (apt-get install $*)"
	log "installing $* (Debian)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}
command -v python3 >/dev/null || apt_install python3 python3-venv
# The database of the run is made and dropped with psql.
command -v psql >/dev/null || apt_install postgresql-client

# ------------------------------------------------------------- schemathesis

# The marker holds the requirements the environment was made from: a run
# with other ones, or after an interrupted install, makes it afresh.
if ! cmp -s "$REQUIREMENTS" "$VENV/.installed"; then
	rm -rf "$VENV"
	mkdir -p "$CACHE_DIR"
	if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
		rm -rf "$VENV"
		apt_install python3-venv
		python3 -m venv "$VENV"
	fi
	log "installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
	"$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS" >&2 ||
		{ rm -rf "$VENV"; die "pip install -r $REQUIREMENTS failed"; }
	cp "$REQUIREMENTS" "$VENV/.installed"
fi
ST=$VENV/bin/st
PY=$VENV/bin/python

# -------------------------------------------------------------------- stack

if [[ -z ${DATABASE_URL:-} || -z ${KAFKA_BROKERS:-} ]]; then
	log "DATABASE_URL or KAFKA_BROKERS unset: scripts/stack.sh up (left running)"
	stack_env=$(bash scripts/stack.sh up)
	eval "$stack_env"
fi

RUN=$($PY -c 'import secrets; print(secrets.token_hex(4))')
LOG_DIR=${PROMOFLOW_APIFUZZ_LOG_DIR:-$(mktemp -d /tmp/promoflow-apifuzz.XXXXXX)}
mkdir -p "$LOG_DIR"
DB=apifuzz_$RUN
PIDS=()
cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	psql -q -d "$DATABASE_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 ||
		log "WARNING: could not drop database $DB"
	rm -f "$LOG_DIR/promoflow"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "go build promoflow"
go build -o "$LOG_DIR/promoflow" ./app
psql -q -d "$DATABASE_URL" -c "CREATE DATABASE $DB" >/dev/null
FUZZ_DATABASE_URL=$($PY -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$DATABASE_URL" "$DB")
TENANT_TOKEN=$($PY -c 'import secrets; print(secrets.token_urlsafe(24))')
TENANT=$($PY -c 'import uuid; print(uuid.uuid4())')
ADMIN_TOKEN=$($PY -c 'import secrets; print(secrets.token_urlsafe(24))')
FEED_TOKEN=$($PY -c 'import secrets; print(secrets.token_urlsafe(24))')

# start NAME COMMAND ENV...: starts promoflow COMMAND with ENV on a port the
# kernel picks, and sets ADDR to where it listens once /readyz answers 200.
start() {
	local name=$1 command=$2 out=$LOG_DIR/$1.log
	shift 2
	: >"$out" # there before the process is, for the loop below to read
	env DATABASE_URL="$FUZZ_DATABASE_URL" KAFKA_BROKERS="$KAFKA_BROKERS" HTTP_ADDR=127.0.0.1:0 ADMIN_ADDR=127.0.0.1:0 \
		PROMOTION_TOPIC="apifuzz.$RUN.purchase-changed" KAFKA_TOPIC_PARTITIONS=1 "$@" \
		"$LOG_DIR/promoflow" "$command" >"$out" 2>&1 &
	PIDS+=($!)
	ADDR=
	local i
	for ((i = 0; i < 600; i++)); do
		kill -0 "${PIDS[-1]}" 2>/dev/null || { tail -n 20 "$out" >&2; die "$name exited at start"; }
		# The public listener: the documents describe it (/admin and /metrics are on the internal one).
		ADDR=${ADDR:-$(sed -n 's/.*"msg":"http listening".*"listener":"public","addr":"\([^"]*\)".*/\1/p' "$out" | head -n 1)}
		if [[ -n $ADDR ]] && $PY -c 'import sys, urllib.request as r; sys.exit(r.urlopen(sys.argv[1], timeout=2).status != 200)' \
			"http://$ADDR/readyz" 2>/dev/null; then
			log "$name ready on $ADDR (log: $out)"
			return
		fi
		sleep 0.2
	done
	tail -n 20 "$out" >&2
	die "$name not ready after 120s"
}

# The migrations are a step of their own, before the processes start.
DATABASE_URL="$FUZZ_DATABASE_URL" "$LOG_DIR/promoflow" migrate up >"$LOG_DIR/migrate.log" 2>&1 ||
	{ tail -n 20 "$LOG_DIR/migrate.log" >&2; die "promoflow migrate up failed"; }
start promotion promotion PROMOTION_API_TOKENS="$TENANT_TOKEN=$TENANT"
PROMOTION_ADDR=$ADDR
start catalog catalog CATALOG_ADMIN_TOKEN="$ADMIN_TOKEN" CATALOG_FEED_TOKEN="$FEED_TOKEN" CATALOG_CONSUMER_GROUP="apifuzz.$RUN" \
	CATALOG_DLQ_TOPIC="apifuzz.$RUN.dlq" CATALOG_REPLAY_TOPIC="apifuzz.$RUN.replay"
CATALOG_ADDR=$ADDR

# --------------------------------------------------------------------- fuzz

# fuzz NAME ADDR TOKEN: Schemathesis against the API at ADDR, with the
# settings and checks of scripts/apifuzz/; appends its summary to LINES (and
# a short one to SHORT) and returns its exit status.
LINES=()
SHORT=()
fuzz() {
	local name=$1 addr=$2 token=$3 out=$LOG_DIR/$1.schemathesis.txt rc=0 start=$SECONDS
	log "st run http://$addr/openapi.json ($name, seed $SEED, $EXAMPLES examples)"
	# In LOG_DIR, without bytecode beside hooks.py: nothing of the run lands in
	# the checkout (Schemathesis keeps its crash files in its working folder).
	(cd "$LOG_DIR" && PYTHONDONTWRITEBYTECODE=1 SCHEMATHESIS_HOOKS=$ROOT/scripts/apifuzz/hooks.py "$ST" --config-file "$ROOT/scripts/apifuzz/$name.toml" \
		run "http://$addr/openapi.json" --checks all --phases examples,coverage,fuzzing,stateful \
		--seed "$SEED" --max-examples "$EXAMPLES" --header "Authorization: Bearer $token" \
		--generation-database none --report junit --report-dir "$LOG_DIR/$name" --no-color </dev/null 2>&1) |
		tee "$out" || rc=$?
	# Schemathesis' own summary: operations tested, cases, and its closing line.
	local tested cases verdict
	tested=$(sed -n 's/^  Tested: \([0-9]*\)$/\1/p' "$out" | tail -n 1)
	cases=$(sed -n '/^Test cases:$/{n;s/^ *//p}' "$out" | tail -n 1)
	verdict=$(sed -n 's/^=* \(.*\) in [0-9.]*s =*$/\1/p' "$out" | tail -n 1)
	LINES+=("$name: ${tested:-?} operations tested; ${cases:-no cases}; ${verdict:-no summary}; exit $rc in $((SECONDS - start))s")
	SHORT+=("$name ${tested:-?} operations ${cases%% generated*} cases: ${verdict:-no summary}")
	return "$rc"
}

rc=0
fuzz promotion "$PROMOTION_ADDR" "$TENANT_TOKEN" || rc=1
fuzz catalog "$CATALOG_ADDR" "$FEED_TOKEN" || rc=1
# A 5xx leaves its cause in the process log, which the report cannot show.
if grep -h '"level":"ERROR"' "$LOG_DIR"/promotion.log "$LOG_DIR"/catalog.log | grep -F 'api failed' >&2; then
	log "the processes logged failed requests (above; logs in $LOG_DIR)"
	rc=1
fi

echo
for line in "${LINES[@]}"; do
	echo "apifuzz: $line"
done
verdict=PASS
((rc == 0)) || verdict=FAIL
short=$(printf '%s; ' "${SHORT[@]}")
# The last line; scripts/test.sh quotes it up to "; Schemathesis".
echo "apifuzz: $verdict: ${short}Schemathesis $SCHEMATHESIS_VERSION, seed $SEED, $EXAMPLES examples, logs in $LOG_DIR"
exit "$rc"
