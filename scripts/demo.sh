#!/usr/bin/env bash
# The main job on the embedded default (Delta via deltalake + SQLite): installs, then runs the demo.
# It installs what every demo the README names needs, so `outbox demo geo` and `outbox demo devices`
# run after it too: the mqtt extra (paho-mqtt) and mosquitto (Debian's package, a local broker).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "==> installing the mqtt extra (outbox demo devices)"
.venv/bin/uv pip install -q --python .venv/bin/python -e '.[mqtt]'
# mosquitto needs root or sudo; without them the main demo still runs, and `outbox demo devices`
# says in one line what is missing.
scripts/ensure-mosquitto.sh || echo "warning: mosquitto was not installed; \`outbox demo devices\` needs it (scripts/ensure-mosquitto.sh)" >&2
exec .venv/bin/outbox demo "$@"
