#!/usr/bin/env bash
# Prints the path of a helm binary for the chart's test (app/helm_test.go),
# after building it from the Go module proxy into the cache folder when it
# is not there yet (about 2 minutes on 2 cores):
#
#   export PROMOFLOW_HELM=$(bash scripts/helm.sh)
#
#   PROMOFLOW_HELM_VERSION   helm.sh/helm/v3 version  [v3.22.0]
#   PROMOFLOW_CACHE          cache folder             [~/.cache/promoflow]
set -euo pipefail

VERSION=${PROMOFLOW_HELM_VERSION:-v3.22.0}
CACHE_DIR=${PROMOFLOW_CACHE:-$HOME/.cache/promoflow}
BIN_DIR=$CACHE_DIR/helm-$VERSION/bin

if [[ ! -x $BIN_DIR/helm ]]; then
	printf 'helm.sh: building helm %s into %s\n' "$VERSION" "$BIN_DIR" >&2
	mkdir -p "$BIN_DIR"
	# Outside the module, so that its go.mod neither builds nor records helm.
	(cd "$BIN_DIR" && GOBIN=$BIN_DIR GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install "helm.sh/helm/v3/cmd/helm@$VERSION") >&2
fi
"$BIN_DIR/helm" version --short >&2
printf '%s\n' "$BIN_DIR/helm"
