#!/usr/bin/env bash
# Creates .venv and installs delta-outbox into it (with --dev: every extra and the test tools).
# Idempotent: a second run only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "error: delta-outbox needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check uv
fi
echo "==> installing Python packages"
if [ "${1:-}" = "--dev" ]; then
  .venv/bin/uv pip install -q --python .venv/bin/python -e . --group dev
else
  .venv/bin/uv pip install -q --python .venv/bin/python -e .
fi
