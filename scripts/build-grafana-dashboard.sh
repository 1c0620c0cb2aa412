#!/usr/bin/env bash
# Build gpulab's Grafana dashboard generator (scripts/grafana-dashboard, Go, on the Apache-licensed
# github.com/grafana/grafana-foundation-sdk/go module; Grafana itself is AGPL and never used) once
# per SDK version and source, outside the work tree; print the binary's path.
#
#   "$(scripts/build-grafana-dashboard.sh)" > helm/gpulab/dashboards/gpulab.json   # regenerate
#   "$(scripts/build-grafana-dashboard.sh)" -check FILE                             # strict check
#
# The build runs at the lowest CPU priority: the machines are shared.
set -euo pipefail

SDK_VERSION=v0.0.22  # = scripts/grafana-dashboard/go.mod
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/grafana-sdk/$SDK_VERSION
SRC=$(cd "$(dirname "$0")/grafana-dashboard" && pwd)
BIN=$OUT/bin/grafana-dashboard
STAMP=$OUT/.built

log() { printf '\033[1m[build-grafana-dashboard]\033[0m %s\n' "$*" >&2; }

grep -q "grafana-foundation-sdk/go $SDK_VERSION" "$SRC/go.mod" || { log "$SRC/go.mod does not require the SDK at $SDK_VERSION"; exit 1; }
hash=$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC"/*.go | sha256sum | cut -d' ' -f1)
if [[ -x $BIN ]] && [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$hash" ]]; then
  echo "$BIN"
  exit 0
fi
[[ -x /usr/local/go/bin/go ]] && export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { log "Go is not installed: the dashboard is generated with the Grafana Foundation SDK's Go module (Go >= 1.21)"; exit 1; }
mkdir -p "$OUT/bin"
export GOCACHE=$OUT/gocache
log "building the dashboard generator on grafana-foundation-sdk/go $SDK_VERSION"
start=$(date +%s)
(cd "$SRC" && nice -n 19 go build -trimpath -o "$BIN.tmp" . && mv "$BIN.tmp" "$BIN")
log "built in $(( $(date +%s) - start )) s"
echo "$hash" > "$STAMP"
echo "$BIN"
