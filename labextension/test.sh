#!/usr/bin/env bash
# Unit tests of the lab extension's TypeScript logic (vitest).
set -euo pipefail
cd "$(dirname "$0")"
if [[ ! -d node_modules ]] || [[ package-lock.json -nt node_modules/.package-lock.json ]]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi
exec npx --no-install vitest run "$@"
