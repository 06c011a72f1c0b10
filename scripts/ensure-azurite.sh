#!/usr/bin/env bash
# Installs Azurite (the Azure Storage emulator, npm package azurite 3.37.0), which the object-store
# tests start on 127.0.0.1, into .cache/azurite/. Idempotent: a second run does nothing. Node.js
# and npm come from Debian's packages when missing. Prints the azurite-blob path; the tests find
# it there, or wherever OUTBOX_TEST_AZURITE_DIR points.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/azurite
version=3.37.0
bin="$out/node_modules/.bin/azurite-blob"
installed="$out/node_modules/azurite/package.json"
if [ -x "$bin" ] && grep -q "\"version\": \"$version\"" "$installed" 2>/dev/null; then
  echo "$PWD/$bin"
  exit 0
fi
need_apt=()
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  scripts/apt-install.sh "${need_apt[@]}"
fi
echo "==> npm install azurite@$version into $out" >&2
mkdir -p "$out"
[ -f "$out/package.json" ] || echo '{"name": "outbox-test-azurite", "private": true}' >"$out/package.json"
npm install --prefix "$out" --no-audit --no-fund --loglevel=error "azurite@$version" >&2
echo "$PWD/$bin"
