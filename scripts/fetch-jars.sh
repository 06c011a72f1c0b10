#!/usr/bin/env bash
# Downloads the Delta Lake JARs for the Spark rescuer engine from Maven Central into .cache/jars.
# Only io.delta artifacts are kept: Spark, Hadoop, Scala and Parquet come with the pyspark wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/jars
if ls "$out"/delta-spark_*.jar >/dev/null 2>&1 && ls "$out"/delta-storage-*.jar >/dev/null 2>&1; then
  exit 0
fi
scripts/ensure-maven.sh
echo "==> fetching Delta JARs with Maven"
mkdir -p "$out"
mvn -q -B -f scripts/maven/pom.xml dependency:copy-dependencies \
  -DoutputDirectory="$PWD/$out" -DincludeGroupIds=io.delta \
  -DexcludeArtifactIds=delta-kernel-api,delta-kernel-defaults,delta-kernel-unitycatalog
ls "$out"
