#!/usr/bin/env bash
# Installs the local Cosmos DB-protocol server the Cosmos tests start (@vercel/cosmosdb-server
# 1.0.1, from the npm registry) into .cache/cosmos/. Idempotent: a second run does nothing.
# Node.js and npm come from Debian's packages when missing. Prints the server's path; the tests
# find it there, or wherever OUTBOX_TEST_COSMOS_SERVER points.
set -euo pipefail
exec "$(dirname "$0")/ensure-npm-package.sh" cosmos @vercel/cosmosdb-server 1.0.1 cosmosdb-server
