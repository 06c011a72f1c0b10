#!/usr/bin/env bash
# Runs every check on a fresh machine: installs what is missing (venv, Python packages, Delta JARs
# and a Kafka broker's JARs via Maven, PostgreSQL, mosquitto and Chromium with its driver via apt, the Cosmos DB-protocol test server and Azurite via
# npm, the S3 test server (moto) with the Python packages), then ruff,
# import-linter (the layers), mypy (strict) and the whole pytest suite, measuring the shipped
# packages' coverage (the run fails below fail_under in pyproject.toml).
#
# scripts/test.sh --fast is the inner loop's lane (a few minutes): the same checks, then only the
# tests that start no JVM, broker, browser or child processes (tests/fastlane.py chooses them), and
# it skips fetching what only those left out need (the Delta and Kafka JARs, Chromium, Azurite).
# .ci/run never passes --fast.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [[ "${1:-}" == "--fast" ]]; then
  fast=1
  shift
fi
scripts/setup.sh --dev
if [[ $fast == 0 ]]; then
  scripts/fetch-jars.sh
  scripts/fetch-kafka.sh   # the Kafka broker's JARs, into .cache/kafka/libs (tests/kafka starts it)
fi
scripts/ensure-postgres.sh
scripts/ensure-mosquitto.sh  # the MQTT tests start their own broker from it
if [[ $fast == 0 ]]; then
  scripts/ensure-chromium.sh   # the console's browser tests drive Debian's headless Chromium
fi
scripts/ensure-cosmos.sh >/dev/null   # into .cache/cosmos, where tests/cosmos finds it
if [[ $fast == 0 ]]; then
  scripts/ensure-azurite.sh >/dev/null  # into .cache/azurite, where tests/objectstore finds it
fi
export OUTBOX_DELTA_JARS="$PWD/.cache/jars"
echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> import-linter (layers)"
.venv/bin/lint-imports
echo "==> mypy (strict)"
.venv/bin/mypy
if [[ $fast == 1 ]]; then
  echo "==> pytest, the fast lane (2 workers)"
  .venv/bin/pytest -n 2 --dist loadgroup --fast "$@"
  exit
fi
echo "==> pytest (2 workers; the Spark tests share one, the checker's seed pools one), with coverage"
# -n 2: much of the suite waits on child processes, a JVM or a server, so two workers overlap
# those waits on the 2 cores; tests/conftest.py groups the tests that must share a worker.
# --cov: the shipped packages ([tool.coverage] in pyproject.toml); below its fail_under the run
# fails. The fast lane above measures nothing: it is the inner loop's few minutes.
.venv/bin/pytest -n 2 --dist loadgroup --cov --cov-report=term:skip-covered "$@"
