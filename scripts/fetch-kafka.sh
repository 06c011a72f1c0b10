#!/usr/bin/env bash
# Downloads a one-node Apache Kafka broker (4.4.0, KRaft mode) and its runtime JARs from Maven
# Central into .cache/kafka/libs, where tests/kafka and benchmarks/kafka.py start it on 127.0.0.1.
# Idempotent: a second run only checks that the JARs are there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/kafka/libs
if ls "$out"/kafka_2.13-4.4.0.jar >/dev/null 2>&1 && ls "$out"/kafka-server-4.4.0.jar >/dev/null 2>&1; then
  exit 0
fi
scripts/ensure-maven.sh
echo "==> fetching the Kafka broker's JARs with Maven"
mkdir -p "$out"
mvn -q -B -f scripts/maven/kafka/pom.xml dependency:copy-dependencies \
  -DoutputDirectory="$PWD/$out" -DincludeScope=runtime
ls "$out" | wc -l
