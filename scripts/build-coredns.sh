#!/usr/bin/env bash
# Build CoreDNS from Go modules for the Kubernetes test bed, once per version, outside
# the work tree; print the folder that holds the binary (bin/coredns).
#
# The bed runs it with its kubernetes plugin against the bed's API server, as a
# cluster's kube-dns Service does, so that pods resolve the names their operators give
# them (a JobSet's <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>).
# github.com/coredns/coredns's go.mod has no replace lines and its main package is the
# module root (coredns.go, with the plugins of plugin.cfg compiled in), so one
# `go build` of the module path works. The build runs at the lowest CPU priority: the
# machines are shared.
set -euo pipefail
# shellcheck source=lib/go-release.sh
source "$(dirname "$0")/lib/go-release.sh"

COREDNS_VERSION=${GPULAB_COREDNS_VERSION:-v1.13.1}
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/coredns/$COREDNS_VERSION
STAMP=$OUT/.built

log() { printf '\033[1m[build-coredns]\033[0m %s\n' "$*" >&2; }

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$COREDNS_VERSION" ]]; then
  echo "$OUT"
  exit 0
fi
go_release_module coredns github.com/coredns/coredns "$COREDNS_VERSION" "$OUT"
log "building github.com/coredns/coredns (coredns.go) of CoreDNS $COREDNS_VERSION (a cold build takes many minutes on 2 cores)"
start=$(date +%s)
nice -n 19 go build -trimpath \
  -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
  -o "$OUT/bin/coredns" github.com/coredns/coredns
log "built in $(( $(date +%s) - start )) s"
echo "$COREDNS_VERSION" > "$STAMP"
echo "$OUT"
