#!/usr/bin/env bash
# Build Kubeflow Trainer's controller manager from Go modules for the Kubernetes
# test bed, once per version, outside the work tree; print the folder that holds
# the binary (bin/trainer-controller-manager), the release's CRDs (crds/) and the
# torch ClusterTrainingRuntime it ships (runtimes/torch_distributed.yaml), and the
# RBAC, webhook and controller configuration of its manifests (config/: rbac/,
# webhook/, manager/controller_manager_config.yaml; the test bed applies them).
#
# github.com/kubeflow/trainer/v2's go.mod has no replace lines, so a module of
# our own that requires the release builds cmd/trainer-controller-manager as is.
# The build runs at the lowest CPU priority: the machines are shared.
set -euo pipefail
# shellcheck source=lib/go-release.sh
source "$(dirname "$0")/lib/go-release.sh"

TRAINER_VERSION=${GPULAB_TRAINER_VERSION:-v2.2.0}
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/trainer/$TRAINER_VERSION
STAMP=$OUT/.built
MODULE=github.com/kubeflow/trainer/v2

log() { printf '\033[1m[build-trainer]\033[0m %s\n' "$*" >&2; }

# The release's manifests, copied writable beside the binary.
copy_release_files() {
  local src
  src=$(go_release_dir "$MODULE" "$TRAINER_VERSION")
  rm -rf "$OUT/crds" "$OUT/runtimes" "$OUT/config"
  cp -r "$src/manifests/base/crds" "$OUT/crds"
  rm -f "$OUT/crds/kustomization.yaml"
  mkdir -p "$OUT/runtimes" "$OUT/config/manager"
  cp "$src/manifests/base/runtimes/torch_distributed.yaml" "$OUT/runtimes/"
  cp -r "$src/manifests/base/rbac" "$src/manifests/base/webhook" "$OUT/config/"
  cp "$src/manifests/base/manager/controller_manager_config.yaml" "$OUT/config/manager/"
  chmod -R u+w "$OUT/crds" "$OUT/runtimes" "$OUT/config"
}

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$TRAINER_VERSION" ]]; then
  # A cache built before the manifests were kept: add them (the module is in Go's cache).
  [[ -d $OUT/config/rbac ]] || copy_release_files
  echo "$OUT"
  exit 0
fi
go_release_module trainer $MODULE "$TRAINER_VERSION" "$OUT"
log "building $MODULE/cmd/trainer-controller-manager of Trainer $TRAINER_VERSION (a cold build takes many minutes on 2 cores)"
start=$(date +%s)
nice -n 19 go build -trimpath -ldflags "-s -w" \
  -o "$OUT/bin/trainer-controller-manager" "$MODULE/cmd/trainer-controller-manager"
copy_release_files
log "built in $(( $(date +%s) - start )) s"
echo "$TRAINER_VERSION" > "$STAMP"
echo "$OUT"
