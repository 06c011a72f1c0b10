#!/usr/bin/env bash
# Installs Java 17 and Maven from Debian's packages when either is missing: what
# scripts/fetch-jars.sh and scripts/fetch-kafka.sh need to fetch JARs from Maven Central.
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
if [ ${#need_apt[@]} -gt 0 ]; then
  scripts/apt-install.sh "${need_apt[@]}"
fi
