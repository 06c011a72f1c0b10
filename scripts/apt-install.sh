#!/usr/bin/env bash
# Installs Debian packages (as root, or through sudo). Used for PostgreSQL, Java and Maven.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "error: installing $* needs root (or sudo)" >&2; exit 1
  fi
fi
echo "==> apt-get install $*"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
