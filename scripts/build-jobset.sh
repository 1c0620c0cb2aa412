#!/usr/bin/env bash
# Build JobSet's controller manager from Go modules for the Kubernetes test bed,
# once per version, outside the work tree; print the folder that holds the
# binary (bin/jobset), the release's CRDs (crds/) and the RBAC, webhook and
# controller configuration its kustomization installs (config/: rbac/, webhook/,
# manager/controller_manager_config.yaml; the test bed applies them).
#
# sigs.k8s.io/jobset's go.mod has no replace lines and its main package is the
# module root (main.go), so one `go build` of the module path works. The build
# runs at the lowest CPU priority: the machines are shared.
set -euo pipefail
# shellcheck source=lib/go-release.sh
source "$(dirname "$0")/lib/go-release.sh"

JOBSET_VERSION=${GPULAB_JOBSET_VERSION:-v0.11.1}
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/jobset/$JOBSET_VERSION
STAMP=$OUT/.built

log() { printf '\033[1m[build-jobset]\033[0m %s\n' "$*" >&2; }

# The release's manifests, copied writable beside the binary.
copy_release_files() {
  local src
  src=$(go_release_dir sigs.k8s.io/jobset "$JOBSET_VERSION")
  rm -rf "$OUT/crds" "$OUT/config"
  cp -r "$src/config/components/crd/bases" "$OUT/crds"
  mkdir -p "$OUT/config/manager"
  cp -r "$src/config/components/rbac" "$src/config/components/webhook" "$OUT/config/"
  cp "$src/config/components/manager/controller_manager_config.yaml" "$OUT/config/manager/"
  cp "$src/config/default/kustomization.yaml" "$OUT/config/"
  chmod -R u+w "$OUT/crds" "$OUT/config"
}

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$JOBSET_VERSION" ]]; then
  # A cache built before the manifests were kept: add them (the module is in Go's cache).
  [[ -d $OUT/config/rbac ]] || copy_release_files
  echo "$OUT"
  exit 0
fi
go_release_module jobset sigs.k8s.io/jobset "$JOBSET_VERSION" "$OUT"
log "building sigs.k8s.io/jobset (main.go) of JobSet $JOBSET_VERSION (a cold build takes many minutes on 2 cores)"
start=$(date +%s)
nice -n 19 go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION" \
  -o "$OUT/bin/jobset" sigs.k8s.io/jobset
copy_release_files
log "built in $(( $(date +%s) - start )) s"
echo "$JOBSET_VERSION" > "$STAMP"
echo "$OUT"
