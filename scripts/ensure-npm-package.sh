#!/usr/bin/env bash
# Installs one npm package a test server runs from (a pinned version) into .cache/<folder>/.
# Usage: scripts/ensure-npm-package.sh FOLDER PACKAGE VERSION BIN
# Idempotent: when BIN is there at VERSION, a second run does nothing. Node.js and npm come from
# Debian's packages when missing. Prints the path of node_modules/.bin/BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
folder=$1 package=$2 version=$3 binary=$4
out=.cache/$folder
bin="$out/node_modules/.bin/$binary"
installed="$out/node_modules/$package/package.json"
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
echo "==> npm install $package@$version into $out" >&2
mkdir -p "$out"
[ -f "$out/package.json" ] || echo "{\"name\": \"outbox-test-$folder\", \"private\": true}" >"$out/package.json"
npm install --prefix "$out" --no-audit --no-fund --loglevel=error "$package@$version" >&2
echo "$PWD/$bin"
