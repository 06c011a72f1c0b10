#!/usr/bin/env bash
# The MQTT tests start their own throwaway broker from Debian's mosquitto package (tests/mqtt).
# Quiet and quick when it is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null 2>&1; then exit 0; fi
scripts/apt-install.sh mosquitto
