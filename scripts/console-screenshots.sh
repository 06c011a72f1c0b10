#!/usr/bin/env bash
# Refreshes the console's screenshots in docs/images from a workspace of sample data, through
# Debian's headless Chromium (installed by scripts/ensure-chromium.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-chromium.sh
.venv/bin/python scripts/console_screenshots.py "${1:-docs/images}"
