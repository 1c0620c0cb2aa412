# Shared steps of the scripts that build a released Go module for the test bed
# (build-kai.sh, build-jobset.sh, build-trainer.sh): sourced, not run.
#
# `go install pkg@version` also reads the module's version list (for deprecations),
# which the proxy may refuse while it serves the exact version: each build goes through
# a small module of our own that requires the release instead. A dependency's replace
# lines are ignored by Go, so a release whose go.mod has any is refused with what to do.

# go_release_dir MODULE VERSION: the release's source folder in Go's module cache.
go_release_dir() {
  go mod download -json "$1@$2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

# go_release_module NAME MODULE VERSION OUT: check Go, write the module of our own that
# requires MODULE@VERSION into OUT/src, and cd there (GOFLAGS -mod=mod exported).
go_release_module() {
  local name=$1 module=$2 version=$3 out=$4 gomod
  command -v go >/dev/null || { log "Go is not installed: $name is built from Go modules"; exit 1; }
  mkdir -p "$out/bin" "$out/src"
  cd "$out/src"
  log "reading $module@$version's go.mod from the module proxy"
  gomod=$(go mod download -json "$module@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  if grep -qE '^replace|=>' "$gomod"; then
    log "$module@$version's go.mod has replace lines, which a dependency's build ignores: copy them into this build's module"
    exit 1
  fi
  {
    echo "module gpulab.local/${name}testbed"
    echo
    grep -m1 -E '^go [0-9.]+' "$gomod"
    echo
    echo "require $module $version"
  } > go.mod
  printf '// Package %stestbed only pins the %s release gpulab'"'"'s test bed builds.\npackage %stestbed\n' \
    "$name" "$name" "$name" > tools.go
  export GOFLAGS="${GOFLAGS:-} -mod=mod"
}
