#!/usr/bin/env bash
# Build JobSet's controller manager from Go modules for the Kubernetes test bed,
# once per version, outside the work tree; print the folder that holds the
# binary (bin/jobset) and the release's CRDs (crds/).
#
# sigs.k8s.io/jobset's go.mod has no replace lines and its main package is the
# module root (main.go), so one `go build` of the module path works. The build
# runs at the lowest CPU priority: the machines are shared.
set -euo pipefail

JOBSET_VERSION=${GPULAB_JOBSET_VERSION:-v0.11.1}
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/jobset/$JOBSET_VERSION
STAMP=$OUT/.built

log() { printf '\033[1m[build-jobset]\033[0m %s\n' "$*" >&2; }

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$JOBSET_VERSION" ]]; then
  echo "$OUT"
  exit 0
fi
command -v go >/dev/null || { log "Go is not installed: JobSet is built from Go modules (Go >= 1.25)"; exit 1; }
mkdir -p "$OUT/bin" "$OUT/src"
cd "$OUT/src"
# `go install pkg@version` also reads the module's version list (for deprecations),
# which the proxy may refuse while it serves the exact version: build from a small
# module of our own that requires the release instead.
log "reading sigs.k8s.io/jobset@$JOBSET_VERSION's go.mod from the module proxy"
gomod=$(go mod download -json "sigs.k8s.io/jobset@$JOBSET_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
if grep -qE '^replace|=>' "$gomod"; then
  log "sigs.k8s.io/jobset@$JOBSET_VERSION's go.mod has replace lines, which a dependency's build ignores: copy them into this script's module"
  exit 1
fi
{
  echo "module gpulab.local/jobsettestbed"
  echo
  grep -m1 -E '^go [0-9.]+' "$gomod"
  echo
  echo "require sigs.k8s.io/jobset $JOBSET_VERSION"
} > go.mod
printf '// Package jobsettestbed only pins the JobSet release gpulab'"'"'s test bed builds.\npackage jobsettestbed\n' > tools.go
export GOFLAGS="${GOFLAGS:-} -mod=mod"
log "building sigs.k8s.io/jobset (main.go) of JobSet $JOBSET_VERSION (a cold build takes many minutes on 2 cores)"
start=$(date +%s)
nice -n 19 go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION" \
  -o "$OUT/bin/jobset" sigs.k8s.io/jobset
src=$(go mod download -json "sigs.k8s.io/jobset@$JOBSET_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
rm -rf "$OUT/crds"
cp -r "$src/config/components/crd/bases" "$OUT/crds"
chmod -R u+w "$OUT/crds"
log "built in $(( $(date +%s) - start )) s"
echo "$JOBSET_VERSION" > "$STAMP"
echo "$OUT"
