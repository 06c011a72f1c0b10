#!/usr/bin/env bash
# Installs the local Cosmos DB-protocol server the Cosmos tests start (@vercel/cosmosdb-server
# 1.0.1, from the npm registry) into .cache/cosmos/. Idempotent: a second run does nothing.
# Node.js and npm come from Debian's packages when missing. Prints the server's path; the tests
# find it there, or wherever OUTBOX_TEST_COSMOS_SERVER points.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/cosmos
version=1.0.1
bin="$out/node_modules/.bin/cosmosdb-server"
installed="$out/node_modules/@vercel/cosmosdb-server/package.json"
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
echo "==> npm install @vercel/cosmosdb-server@$version into $out" >&2
mkdir -p "$out"
[ -f "$out/package.json" ] || echo '{"name": "outbox-test-cosmos", "private": true}' >"$out/package.json"
npm install --prefix "$out" --no-audit --no-fund --loglevel=error \
  "@vercel/cosmosdb-server@$version" >&2
echo "$PWD/$bin"
