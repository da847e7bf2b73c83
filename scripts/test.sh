#!/usr/bin/env bash
# promoflow's test command (CI runs it through .ci/run).
#
#   scripts/test.sh [extra go test args...]
#
# 1. installs what is missing (PostgreSQL via scripts/stack.sh, PgBouncer,
#    Go modules);
# 2. starts PostgreSQL + Kafka with scripts/stack.sh, unless DATABASE_URL and
#    KAFKA_BROKERS are both set already (then those are used as they are), and
#    fetches the Kafka jars that the TLS/SASL tests start a broker from;
# 3. go vet ./... and go test -race -count=1 -timeout 30m -v ./... "$@";
# 4. a short fuzz run (200,000 inputs) for every Fuzz* function in the repo;
# 5. both HTTP APIs against Schemathesis (scripts/apifuzz.sh: its own
#    database and topics on the same stack; PROMOFLOW_SKIP_APIFUZZ=1 skips it);
# 6. stops the services that it started itself;
# 7. the fault-injection suite in its short form (scripts/faults.sh short, on
#    a stack of its own; PROMOFLOW_SKIP_FAULTS=1 skips it), and exits non-zero
#    if any step failed (with go test's own status when go test failed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STACK=$ROOT/scripts/stack.sh
# A count, not a duration: go1.26's coordinator can report its own -fuzztime
# deadline as a failure ("context deadline exceeded", no input written;
# golang/go#75804, fixed in go1.27). Minimizing a new input is capped so that
# a target's slow inputs cannot stretch the run.
FUZZTIME=${PROMOFLOW_FUZZTIME:-200000x}
FUZZMINIMIZETIME=${PROMOFLOW_FUZZMINIMIZETIME:-5s}

log() { printf 'test.sh: %s\n' "$*" >&2; }

# Per-step wall times, printed with the summary ("steps: ...").
STEPS=()
STEP=""
STEP_T0=$SECONDS
step() {
	if [[ -n $STEP ]]; then
		local took=$((SECONDS - STEP_T0))
		STEPS+=("$STEP $((took / 60))m$((took % 60))s")
	fi
	STEP=$1
	STEP_T0=$SECONDS
}
step toolchain
die() { printf 'test.sh: ERROR: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ toolchain

# Go lives in /usr/local/go on our machines; CI's PATH may not name it.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH=$PATH:/usr/local/go/bin
fi
command -v go >/dev/null || die "go not found (expected on PATH or in /usr/local/go/bin)"

# -race needs cgo, hence a C compiler.
if ! command -v gcc >/dev/null; then
	[[ $(id -u) -eq 0 ]] || die "gcc is missing (needed by go test -race)"
	log "installing gcc (needed by -race)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >&2
fi
export CGO_ENABLED=1

log "go mod download"
go mod download

# ---------------------------------------------------------------------- stack
step stack

# Services this run started, stopped again on exit. Whatever already ran
# before (e.g. a developer's stack) is left running.
STARTED=()
stop_started() {
	if ((${#STARTED[@]})); then
		log "stopping ${STARTED[*]}"
		bash "$STACK" down "${STARTED[@]}" || log "WARNING: stack.sh down failed"
	fi
}
trap stop_started EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The tests start the PgBouncers they need; their DATABASE_URL is the server.
export PROMOFLOW_PGBOUNCER=0
unset DATABASE_DIRECT_URL DATABASE_PREPARED_STATEMENTS

if [[ -n ${DATABASE_URL:-} && -n ${KAFKA_BROKERS:-} ]]; then
	log "using DATABASE_URL and KAFKA_BROKERS from the environment; not starting the stack"
	STACK_NOTE="external services"
else
	status=$(bash "$STACK" status 2>/dev/null || true)
	grep -q '^postgresql: running' <<<"$status" || STARTED+=(postgres)
	grep -q '^kafka: running' <<<"$status" || STARTED+=(kafka)
	# Assigned first: a failing "up" must stop the script, and eval "$(...)"
	# would hide its exit status.
	stack_env=$(bash "$STACK" up)
	eval "$stack_env"
	if ((${#STARTED[@]})); then
		STACK_NOTE="started ${STARTED[*]}"
	else
		STACK_NOTE="reused running stack"
	fi
fi
export DATABASE_URL KAFKA_BROKERS
log "DATABASE_URL=$DATABASE_URL KAFKA_BROKERS=$KAFKA_BROKERS"

# The Kafka security tests (app) start a broker of their own with SASL_SSL and
# SSL listeners, from the same jars, on ports the kernel picks (or from
# $PROMOFLOW_SECURE_KAFKA_PORT), with certificates made afresh.
libs_env=$(bash "$STACK" fetch)
eval "$libs_env"
export PROMOFLOW_KAFKA_LIBS

# ---------------------------------------------------------------------- tests

step "vet, rules, tools"
vet_rc=0
log "go vet ./..."
go vet ./... || vet_rc=$?

# Alert rules: promtool comes from Debian's prometheus package.
rules_rc=0
if ! command -v promtool >/dev/null; then
	[[ $(id -u) -eq 0 ]] || die "promtool is missing (apt-get install prometheus)"
	log "installing promtool (Debian package prometheus)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
fi
log "promtool check/test rules"
(cd deploy/prometheus && promtool check rules alerts.yml && promtool test rules alerts_test.yml) || rules_rc=$?

# PgBouncer: the tests start their own (sqlmigrate/pgtest) in transaction
# pooling; Debian's package, as production runs it.
if ! command -v pgbouncer >/dev/null && [[ ! -x /usr/sbin/pgbouncer ]]; then
	[[ $(id -u) -eq 0 ]] || die "pgbouncer is missing (apt-get install pgbouncer)"
	log "installing pgbouncer (Debian package)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >&2
fi

# Helm, for the chart's test (app/helm_test.go: helm lint, helm template,
# strict decoding): built from the Go module proxy when missing.
PROMOFLOW_HELM=$(bash "$ROOT/scripts/helm.sh") || die "cannot build helm (scripts/helm.sh)"
export PROMOFLOW_HELM

step "go test"
test_rc=0
test_out=$(mktemp)
trap 'rm -f "$test_out"; stop_started' EXIT
log "go test -race -count=1 -timeout 30m -v ./... $*"
# pipefail: the pipeline's status is go test's, not tee's.
go test -race -count=1 -timeout 30m -v ./... "$@" 2>&1 | tee "$test_out" || test_rc=$?
pkgs_ok=$(grep -cE '^ok[[:space:]]' "$test_out" || true)
pkgs_failed=$(grep -cE '^FAIL[[:space:]]+[^[:space:]]' "$test_out" || true)
# Top-level tests only; subtests are counted inside their parent.
tests_ok=$(grep -cE '^--- PASS: ' "$test_out" || true)
tests_failed=$(grep -cE '^--- FAIL: ' "$test_out" || true)
tests_skipped=$(grep -cE '^--- SKIP: ' "$test_out" || true)

# Every benchmark once, in its short form (-short): they print their figures
# and the ratio to their same-run baseline, and assert no timing; one fails
# only when its work does not complete, and then counts as a go test failure.
step benchmarks
bench_out=$(mktemp)
log "go test -short -bench . -benchtime 1x ./handlers/... ./router/ (benchmark figures)"
if ! go test -short -count=1 -run '^$' -bench . -benchtime 1x ./handlers/... ./router/ </dev/null >"$bench_out" 2>&1; then
	((test_rc != 0)) || test_rc=1
	cat "$bench_out"
fi
grep -E '^(Benchmark|    .*bench.*:)' "$bench_out" || true
rm -f "$bench_out"

# Fuzz targets found by grep, so new ones are picked up without editing this
# script. go test -fuzz takes one package and one target at a time.
find_fuzz_targets() {
	local f name
	find . \( -name vendor -o -name testdata -o -name '.?*' \) -prune -o \
		-type f -name '*_test.go' -print | sort |
		while IFS= read -r f; do
			sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)([^)]*\*testing\.F).*/\1/p' "$f" |
				while IFS= read -r name; do
					printf '%s %s\n' "$(dirname "$f")" "$name"
				done
		done
}

step fuzz
fuzz_total=0
fuzz_failed=()
while read -r pkg name; do
	fuzz_total=$((fuzz_total + 1))
	log "fuzz $name in $pkg for $FUZZTIME"
	# </dev/null: keep go test away from the loop's input.
	if ! go test -run '^$' -timeout 10m -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" \
		"$pkg" </dev/null; then
		fuzz_failed+=("$pkg:$name")
	fi
done < <(find_fuzz_targets)

# Both APIs against an independent fuzzer, on the same stack.
step "api fuzz"
apifuzz_rc=0
apifuzz_note="skipped (PROMOFLOW_SKIP_APIFUZZ=1)"
if [[ ${PROMOFLOW_SKIP_APIFUZZ:-0} != 1 ]]; then
	apifuzz_out=$(mktemp)
	log "API fuzzing: scripts/apifuzz.sh"
	bash "$ROOT/scripts/apifuzz.sh" </dev/null 2>&1 | tee "$apifuzz_out" || apifuzz_rc=$?
	apifuzz_note=$(grep -E '^apifuzz: (PASS|FAIL): ' "$apifuzz_out" | tail -n 1 | sed 's/^apifuzz: //; s/; Schemathesis .*//')
	apifuzz_note=${apifuzz_note:-"did not finish (exit $apifuzz_rc)"}
	rm -f "$apifuzz_out"
fi

# Stop our services now rather than in the EXIT trap, so that the summary
# below really is the last output (and the fault suite has the machine).
stop_started
STARTED=()

step faults
faults_rc=0
faults_note="skipped (PROMOFLOW_SKIP_FAULTS=1)"
if [[ ${PROMOFLOW_SKIP_FAULTS:-0} != 1 ]]; then
	faults_out=$(mktemp)
	log "fault suite: scripts/faults.sh short"
	bash "$ROOT/scripts/faults.sh" short 2>&1 | tee "$faults_out" || faults_rc=$?
	faults_note=$(grep -E '^faults:' "$faults_out" | tail -n 1 | sed 's/^faults: //')
	faults_note=${faults_note:-"did not finish (exit $faults_rc)"}
	rm -f "$faults_out"
fi

# -------------------------------------------------------------------- summary
step ""

rc=0
if ((test_rc != 0)); then
	rc=$test_rc
elif ((vet_rc != 0 || rules_rc != 0 || apifuzz_rc != 0 || faults_rc != 0 || ${#fuzz_failed[@]} != 0)); then
	rc=1
fi
vet_note=ok
((vet_rc == 0)) || vet_note="FAILED"
test_note=ok
((test_rc == 0)) || test_note="FAILED (exit $test_rc)"
fuzz_note="$((fuzz_total - ${#fuzz_failed[@]}))/$fuzz_total ok"
((${#fuzz_failed[@]} == 0)) || fuzz_note="$fuzz_note, FAILED: ${fuzz_failed[*]}"
verdict=PASS
((rc == 0)) || verdict=FAIL
echo
rules_note=ok
((rules_rc == 0)) || rules_note=FAILED
echo "test.sh: $verdict: go vet $vet_note; alert rules $rules_note; go test $test_note; fuzz $fuzz_note; api fuzz $apifuzz_note; faults $faults_note; stack: $STACK_NOTE"
echo "packages: $pkgs_ok ok, $pkgs_failed failed"
steps=$(printf '%s, ' "${STEPS[@]}")
echo "steps: ${steps%, }; total $((SECONDS / 60))m$((SECONDS % 60))s"
# Closing line in the plain "N passed, N failed" form, counting top-level tests.
echo "tests: $tests_ok passed, $tests_failed failed, $tests_skipped skipped"
exit "$rc"
