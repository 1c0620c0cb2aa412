#!/usr/bin/env bash
# Build Kueue's controller manager from Go modules for the Kubernetes test bed,
# once per version, outside the work tree; print the folder that holds the
# binary (bin/kueue) and the release's manifests (config/: CRDs, webhooks, RBAC).
#
# sigs.k8s.io/kueue's go.mod has no replace lines, so `go install` works as is.
set -euo pipefail
# shellcheck source=lib/go-release.sh
source "$(dirname "$0")/lib/go-release.sh"

KUEUE_VERSION=${GPULAB_KUEUE_VERSION:-v0.17.0}
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/kueue/$KUEUE_VERSION
STAMP=$OUT/.built

log() { printf '\033[1m[build-kueue]\033[0m %s\n' "$*" >&2; }

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$KUEUE_VERSION" ]]; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { log "Go is not installed: Kueue is built from Go modules (Go >= 1.25)"; exit 1; }
mkdir -p "$OUT/bin"
log "building sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION (a cold build takes many minutes on 2 cores)"
start=$(date +%s)
GOBIN=$OUT/bin go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
  "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
src=$(go_release_dir sigs.k8s.io/kueue "$KUEUE_VERSION")
rm -rf "$OUT/config"
mkdir -p "$OUT/config"
cp -r "$src/config/components/crd" "$src/config/components/webhook" "$src/config/components/rbac" "$OUT/config/"
chmod -R u+w "$OUT/config"
log "built in $(( $(date +%s) - start )) s"
echo "$KUEUE_VERSION" > "$STAMP"
echo "$OUT"
