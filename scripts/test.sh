#!/usr/bin/env bash
# Runs every check on a fresh machine: installs what is missing (venv, Python packages, Delta JARs
# and a Kafka broker's JARs via Maven, PostgreSQL, mosquitto and Chromium with its driver via apt, the Cosmos DB-protocol test server and Azurite via
# npm, the S3 test server (moto) with the Python packages), then ruff,
# import-linter (the layers), mypy (strict) and the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
scripts/fetch-jars.sh
scripts/fetch-kafka.sh   # the Kafka broker's JARs, into .cache/kafka/libs (tests/kafka starts it)
scripts/ensure-postgres.sh
scripts/ensure-mosquitto.sh  # the MQTT tests start their own broker from it
scripts/ensure-chromium.sh   # the console's browser tests drive Debian's headless Chromium
scripts/ensure-cosmos.sh >/dev/null   # into .cache/cosmos, where tests/cosmos finds it
scripts/ensure-azurite.sh >/dev/null  # into .cache/azurite, where tests/objectstore finds it
export OUTBOX_DELTA_JARS="$PWD/.cache/jars"
echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> import-linter (layers)"
.venv/bin/lint-imports
echo "==> mypy (strict)"
.venv/bin/mypy
echo "==> pytest (2 workers; the Spark tests share one, the checker's seed pools one)"
# -n 2: much of the suite waits on child processes, a JVM or a server, so two workers overlap
# those waits on the 2 cores; tests/conftest.py groups the tests that must share a worker.
.venv/bin/pytest -n 2 --dist loadgroup "$@"
