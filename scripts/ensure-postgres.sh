#!/usr/bin/env bash
# The PostgreSQL tests start their own throwaway server from Debian's postgresql package.
set -euo pipefail
cd "$(dirname "$0")/.."
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then exit 0; fi
scripts/apt-install.sh postgresql
