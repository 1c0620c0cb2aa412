#!/usr/bin/env bash
# Build the Kubernetes control plane the test bed runs (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) from Go modules, once per version.
#
#   scripts/build-kube.sh          build (or reuse) and print the bin folder
#
# Why a module of our own: k8s.io/kubernetes requires its staging modules
# (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0 and maps them to ./staging with
# replace lines, and Go ignores a dependency's replace lines. So we write a
# small module that requires k8s.io/kubernetes and replaces each staging module
# with its published v0.X.Y tag, and build the commands from it. etcd's server
# is built from the same module at the version Kubernetes itself requires.
#
# Everything lands outside the work tree: sources and binaries under
# $GPULAB_CACHE_DIR (default ~/.cache/gpulab), Go's build and module caches
# where `go env` puts them. A second run with the stamp in place does nothing.
set -euo pipefail

KUBE_VERSION=${GPULAB_KUBE_VERSION:-v1.36.3}
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/kube/$KUBE_VERSION
BIN=$OUT/bin
STAMP=$BIN/.built

log() { printf '\033[1m[build-kube]\033[0m %s\n' "$*" >&2; }

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$KUBE_VERSION" ]]; then
  echo "$BIN"
  exit 0
fi
command -v go >/dev/null || { log "Go is not installed: the test bed is built from Go modules (Go >= 1.26)"; exit 1; }

mkdir -p "$OUT/src" "$BIN"
cd "$OUT/src"
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
staging_version="v0.${KUBE_VERSION#v1.}"

log "reading k8s.io/kubernetes@$KUBE_VERSION's go.mod from the module proxy"
gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
go_line=$(grep -m1 -E '^go [0-9.]+' "$gomod")
godebug_line=$(grep -m1 -E '^godebug ' "$gomod" || true)
staging=$(grep -E '^\s+k8s\.io/[a-z0-9.-]+ => \./staging/' "$gomod" | awk '{print $1}')

{
  echo "module gpulab.local/kubetestbed"
  echo
  echo "$go_line"
  [[ -n $godebug_line ]] && echo "$godebug_line"
  echo
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  echo
  echo "replace ("
  for mod in $staging; do echo "	$mod => $mod $staging_version"; done
  echo ")"
} > go.mod
cat > tools.go <<'EOF'
// Package kubetestbed only pins the Kubernetes release gpulab's test bed builds.
package kubetestbed
EOF

export GOFLAGS="${GOFLAGS:-} -mod=mod"
log "resolving modules (go mod download)"
go get "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null 2>&1 || go get "k8s.io/kubernetes@$KUBE_VERSION"
etcd_version=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
go get "go.etcd.io/etcd/server/v3@$etcd_version"

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
log "building kube-apiserver, kube-controller-manager, kube-scheduler $KUBE_VERSION and etcd $etcd_version (a cold build takes tens of minutes on 2 cores)"
start=$(date +%s)
go build -trimpath -ldflags "$ldflags" -o "$BIN/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler
go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
log "built in $(( $(date +%s) - start )) s"
printf 'kubernetes=%s\netcd=%s\n' "$KUBE_VERSION" "$etcd_version" > "$BIN/VERSIONS"
echo "$KUBE_VERSION" > "$STAMP"
echo "$BIN"
