"""JVM options for short-lived Spark drivers (a test's child driver, the checker's Spark writer).

Such a driver lives for one or two small applies, and on two cores its JVM's C2 compiler threads
were a large share of its CPU (compiling code that then ran for seconds). C1 only
(``TieredStopAtLevel=1``) and the serial collector cut the spark-submit test's CPU by more than
half together with Spark's small-partition settings, and seed 12 of ``outbox check --writer
spark`` from 60 s to 47 s of wall time alone (measured by hand). A long-lived session (a
scheduled rescuer, the test suite's in-process one) keeps the JVM's defaults.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def short_lived_jvm_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the options added to ``JAVA_TOOL_OPTIONS``: every
    JVM started with it reads them (and says "Picked up JAVA_TOOL_OPTIONS" on stderr)."""
    out = dict(os.environ if env is None else env)
    add_short_lived_jvm_options(out)
    return out


def add_short_lived_jvm_options(env: MutableMapping[str, str]) -> None:
    """Add the options to ``env`` in place (``os.environ`` before a JVM starts), once."""
    extra = env.get("JAVA_TOOL_OPTIONS", "")
    if SHORT_LIVED_JVM_OPTIONS not in extra:
        env["JAVA_TOOL_OPTIONS"] = f"{extra} {SHORT_LIVED_JVM_OPTIONS}".strip()
