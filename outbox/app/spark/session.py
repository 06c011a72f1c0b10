"""The SparkSession ``SparkOutbox`` is given must have Delta Lake, checked before anything runs.

Why first: a plain session got as far as creating the workspace and then ran about 40 s of
validation jobs before delta-spark's ``DeltaTable`` failed with ``TypeError: 'JavaPackage' object is
not callable`` (Py4J's answer for a class the JVM does not have). Two cheap looks say it at once:
the session's ``spark.sql.extensions`` names Delta's extension (a static setting, read from the
session's conf without a job), and the JVM finds ``io.delta.tables.DeltaTable`` (the JARs).
"""

from __future__ import annotations

import os
from typing import Any

from outbox.core.errors import DeltaNotConfiguredError
from rescuer.cdf_spark import DELTA_EXTENSION

#: How to get a Delta-enabled session, in the error's ``fix:``.
HOW_TO_GET_DELTA = (
    "pass a session with Delta Lake: outbox.spark.local_session() starts a local one (with the "
    "Delta JARs from scripts/fetch-jars.sh or OUTBOX_DELTA_JARS), delta-spark's "
    "configure_spark_with_delta_pip(builder) sets up yours, and a Databricks runtime has Delta "
    "built in (docs/spark.md)"
)


def delta_problem(spark: Any) -> str | None:
    """What ``spark`` lacks for Delta Lake, or None. On Databricks Delta is built in."""
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return None
    try:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
    except Exception:  # a session without that key (Spark Connect): nothing to read it from
        extensions = ""
    if DELTA_EXTENSION not in extensions:
        return f"its spark.sql.extensions lacks {DELTA_EXTENSION}"
    jvm = getattr(spark, "_jvm", None)  # None on Spark Connect: the server has the classes
    if jvm is not None:
        from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]

        if not isinstance(jvm.io.delta.tables.DeltaTable, JavaClass):
            return "its JVM has no io.delta.tables.DeltaTable (the Delta JARs are not loaded)"
    return None


def require_delta(spark: Any) -> None:
    """Raise ``DeltaNotConfiguredError`` (one line: what is missing and how to get a session)
    unless ``spark`` has Delta Lake."""
    problem = delta_problem(spark)
    if problem is not None:
        raise DeltaNotConfiguredError(
            f"SparkOutbox needs a SparkSession with Delta Lake, and this one has none: {problem}",
            hint=HOW_TO_GET_DELTA,
        )
