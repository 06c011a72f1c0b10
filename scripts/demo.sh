#!/usr/bin/env bash
# The main job on the embedded default (Delta via deltalake + SQLite): installs, then runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/outbox demo "$@"
