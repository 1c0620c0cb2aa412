#!/usr/bin/env bash
# The Python environment the Kubernetes test bed's training pods run in: PyTorch (its
# torchrun and the gloo backend, which all-reduces on CPUs), once per version, outside the
# work tree; print the folder that holds it (bin/python, bin/torchrun).
#
# The bed's node agent runs the containers of the image `gpulab-testbed/torch:<version>`
# with this environment first on PATH (tests/kube/bed/node_agent.py), as a node that has
# pulled that image would. PyPI's Linux wheel of torch needs its CUDA libraries to import
# at all, even on a machine without a GPU (torch/__init__.py preloads libcudart and
# libcublasLt), so they come with it: measured on a 2-core machine, about 50 s and 5.3 GB.
set -euo pipefail

TORCH_VERSION=${GPULAB_TORCH_VERSION:-2.15.0}
CACHE_DIR=${GPULAB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulab}
OUT=$CACHE_DIR/torch/$TORCH_VERSION
STAMP=$OUT/.built
PYTHON=${PYTHON:-python3}

log() { printf '\033[1m[build-torch-env]\033[0m %s\n' "$*" >&2; }

if [[ -f $STAMP ]] && [[ "$(cat "$STAMP")" == "$TORCH_VERSION" ]]; then
  echo "$OUT"
  exit 0
fi
log "installing torch $TORCH_VERSION (with the CUDA libraries its wheel imports) into $OUT"
start=$(date +%s)
rm -rf "$OUT"
"$PYTHON" -m venv "$OUT"
nice -n 19 "$OUT/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" numpy
"$OUT/bin/python" -c 'import torch.distributed as d; assert d.is_gloo_available(), "torch without gloo"'
log "installed in $(( $(date +%s) - start )) s"
echo "$TORCH_VERSION" > "$STAMP"
echo "$OUT"
