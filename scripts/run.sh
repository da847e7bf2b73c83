#!/usr/bin/env bash
# The product's run command: both contexts in one process on this machine.
#
#   scripts/run.sh [promoflow dev flags]
#
# With no arguments it plays the live demo (app/demo): a small catalog, one
# purchase per target kind, the cards' boosts as they change; --no-demo (or
# PROMOFLOW_DEMO=0) skips it.
#
# Without DATABASE_URL it starts a private PostgreSQL (scripts/stack.sh up
# postgres, installing Debian's postgresql when missing). Without
# KAFKA_BROKERS, `promoflow dev` runs an embedded in-process Kafka broker.
# It applies the migrations first (`promoflow migrate up`), as a release does.
# Stop with Ctrl-C; scripts/stack.sh down stops the PostgreSQL it started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH=$PATH:/usr/local/go/bin
fi
if [[ -z ${DATABASE_URL:-} ]]; then
	stack_env=$(bash scripts/stack.sh up postgres)
	eval "$stack_env"
fi
export DATABASE_URL
mkdir -p bin
go build -o bin/promoflow ./app
bin/promoflow migrate up
exec bin/promoflow dev "$@"
