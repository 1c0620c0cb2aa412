#!/usr/bin/env bash
# Build JobSet's controller manager from Go modules for the Kubernetes test bed,
# once per version, outside the work tree; print the folder that holds the
# binary (bin/jobset) and the release's CRDs (crds/).
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

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$JOBSET_VERSION" ]]; then
  echo "$OUT"
  exit 0
fi
go_release_module jobset sigs.k8s.io/jobset "$JOBSET_VERSION" "$OUT"
log "building sigs.k8s.io/jobset (main.go) of JobSet $JOBSET_VERSION (a cold build takes many minutes on 2 cores)"
start=$(date +%s)
nice -n 19 go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION" \
  -o "$OUT/bin/jobset" sigs.k8s.io/jobset
src=$(go_release_dir sigs.k8s.io/jobset "$JOBSET_VERSION")
rm -rf "$OUT/crds"
cp -r "$src/config/components/crd/bases" "$OUT/crds"
chmod -R u+w "$OUT/crds"
log "built in $(( $(date +%s) - start )) s"
echo "$JOBSET_VERSION" > "$STAMP"
echo "$OUT"
