"""JVM options for the short-lived JVMs the tests start in child processes.

A child driver (spark-submit, a driver the test SIGKILLs, the checker's Spark writer) lives for
one or two small applies, and on the CI's two cores its JVM's C2 compiler threads were a large
share of its CPU (compiling code that then ran for seconds). C1 only (``TieredStopAtLevel=1``)
and the serial collector cut the measured CPU of the spark-submit test by more than half together
with Spark's small-partition settings. Only child JVMs get them: the in-process SparkSession runs
the whole Spark group for minutes, where C2's code pays back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CHILD_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def child_jvm_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``JAVA_TOOL_OPTIONS`` for a child's JVM; every JVM
    the child starts reads it (and says "Picked up JAVA_TOOL_OPTIONS" on stderr)."""
    out = dict(os.environ if env is None else env)
    extra = out.get("JAVA_TOOL_OPTIONS", "")
    out["JAVA_TOOL_OPTIONS"] = f"{extra} {CHILD_JVM_OPTIONS}".strip()
    return out
