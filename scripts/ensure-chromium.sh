#!/usr/bin/env bash
# The console's browser tests drive Debian's headless Chromium through its chromedriver
# (tests/console). Quiet and quick when both are already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi
scripts/apt-install.sh chromium chromium-driver
