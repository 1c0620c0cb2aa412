#!/usr/bin/env bash
# Build the KAI scheduler's components from Go modules for the Kubernetes test bed,
# once per version, outside the work tree; print the folder that holds the binaries
# (bin/: scheduler, binder, podgrouper, podgroupcontroller, queuecontroller,
# admission), the release's CRDs (crds/, and external-crds/: its copy of Kueue's
# Topology) and its Helm chart (chart/: the test bed renders the RBAC, priority
# classes, queues and scheduling shard it installs).
#
# github.com/NVIDIA/KAI-scheduler's go.mod has no replace lines and pins every
# Kubernetes staging module it uses, so `go install` works as is. The build runs
# at the lowest CPU priority: the machines are shared.
set -euo pipefail
# shellcheck source=lib/go-release.sh
source "$(dirname "$0")/lib/go-release.sh"

KAI_VERSION=${GPULAB_KAI_VERSION:-v0.20.1}
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/kai/$KAI_VERSION
STAMP=$OUT/.built
COMPONENTS=(scheduler binder podgrouper podgroupcontroller queuecontroller admission)

log() { printf '\033[1m[build-kai]\033[0m %s\n' "$*" >&2; }

# The release's CRDs and chart, copied writable beside the binaries.
copy_release_files() {
  local src
  src=$(go_release_dir github.com/NVIDIA/KAI-scheduler "$KAI_VERSION")
  rm -rf "$OUT/crds" "$OUT/chart" "$OUT/external-crds"
  cp -r "$src/deployments/kai-scheduler/crds" "$OUT/crds"
  cp -r "$src/deployments/kai-scheduler" "$OUT/chart"
  cp -r "$src/deployments/external-crds" "$OUT/external-crds"
  chmod -R u+w "$OUT/crds" "$OUT/chart" "$OUT/external-crds"
}

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$KAI_VERSION" ]]; then
  # A cache built before the chart was kept: add it (the module is in Go's cache).
  [[ -d $OUT/chart && -d $OUT/external-crds ]] || copy_release_files
  echo "$OUT"
  exit 0
fi
go_release_module kai github.com/NVIDIA/KAI-scheduler "$KAI_VERSION" "$OUT"
pkgs=()
for c in "${COMPONENTS[@]}"; do pkgs+=("github.com/NVIDIA/KAI-scheduler/cmd/$c"); done
log "building ${COMPONENTS[*]} of KAI $KAI_VERSION (a cold build takes many minutes on 2 cores)"
start=$(date +%s)
nice -n 19 go build -trimpath -ldflags "-s -w" -o "$OUT/bin/" "${pkgs[@]}"
copy_release_files
log "built in $(( $(date +%s) - start )) s"
echo "$KAI_VERSION" > "$STAMP"
echo "$OUT"
