#!/usr/bin/env bash
# Build the gpulab JupyterLab extension (TypeScript -> prebuilt federated
# extension in labextension/labextension_static/) and make the repo's .venv
# load it: link the build into .venv/share/jupyter/labextensions/ (what
# `jupyter labextension develop` does) and enable the server extension.
#
# Idempotent and fast when nothing changed: the build is skipped when the hash
# of the sources, the lock file and the JupyterLab version matches the stamp.
#   labextension/build.sh            build if needed
#   labextension/build.sh --force    rebuild
set -euo pipefail
cd "$(dirname "$0")"
EXT=$PWD
ROOT=$(cd .. && pwd)
VENV=${GPULAB_VENV:-$ROOT/.venv}
NAME=gpulab-labextension
OUT=$EXT/labextension_static
STAMP=$EXT/.build-stamp
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1
log() { printf '\033[1m[labextension]\033[0m %s\n' "$*" >&2; }
export PATH="$VENV/bin:$PATH"

# 1. npm packages from the committed lock file.
if [[ ! -d node_modules ]] || [[ package-lock.json -nt node_modules/.package-lock.json ]]; then
  log "npm ci"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi

# 2. Build when the inputs changed. The core package file pins the shared
#    @jupyterlab/* versions to the JupyterLab installed in the venv.
CORE=$("$VENV/bin/python" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("jupyterlab").origin), "staging", "package.json"))')
HASH=$( (cat package.json package-lock.json tsconfig.json install.json "$CORE"; find src style -type f | sort | xargs cat) | sha256sum | cut -c1-32)
if [[ $FORCE == 1 ]] || [[ ! -f $OUT/package.json ]] || [[ "$(cat "$STAMP" 2>/dev/null)" != "$HASH" ]]; then
  log "building $NAME"
  rm -rf lib tsconfig.tsbuildinfo
  npx --no-install tsc -b
  jupyter-builder build --core-package-file "$CORE" . >/dev/null
  cp install.json "$OUT/install.json"
  echo "$HASH" > "$STAMP"
fi

# 3. The editable install: what the venv's single-user servers load.
if [[ -d $VENV ]]; then
  DEST=$VENV/share/jupyter/labextensions/$NAME
  mkdir -p "$(dirname "$DEST")"
  if [[ "$(readlink "$DEST" 2>/dev/null)" != "$OUT" ]]; then
    rm -rf "$DEST"
    ln -s "$OUT" "$DEST"
    log "linked $DEST -> $OUT"
  fi
  CONF=$VENV/etc/jupyter/jupyter_server_config.d
  mkdir -p "$CONF"
  if ! cmp -s jupyter-config/jupyter_server_config.d/gpulab.json "$CONF/gpulab.json"; then
    cp jupyter-config/jupyter_server_config.d/gpulab.json "$CONF/gpulab.json"
    log "enabled the server extension in $CONF/gpulab.json"
  fi
fi
