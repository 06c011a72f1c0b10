"""Spark pipelines write documents and their messages: ``SparkOutbox(spark, ".outbox").apply(df)``.

Needs PySpark and delta-spark (``pip install 'delta-outbox[spark]'``) and a SparkSession with Delta
Lake: a Databricks runtime's, or one built with ``local_session()`` (docs/spark.md). Importing this
module loads neither PySpark nor the outbox's Spark code; each name does on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outbox.core.lazy import guard, lazy_exports

if TYPE_CHECKING:
    from outbox.app.spark.api import ApplyResult, SparkOutbox

_EXPORTS = {
    "SparkOutbox": "outbox.app.spark.api",
    "ApplyResult": "outbox.app.spark.api",
}

__all__ = [
    "ApplyResult",
    "SparkOutbox",
    "local_session",
]


def local_session(*, jars: list[str] | None = None, master: str = "local[2]") -> Any:
    """A local SparkSession with Delta Lake, for development and tests outside Databricks.

    The active session when it already has Delta; else one started on ``master`` with Delta's
    extension and catalog and the Delta JARs: ``jars``, else ``OUTBOX_DELTA_JARS`` (files or
    folders), else ``.cache/jars`` (``scripts/fetch-jars.sh`` downloads them from Maven Central).
    One session per process (starting one takes several seconds). A missing JAR, Java or PySpark,
    or an active session without Delta, is one ``OutboxError`` naming the fix.
    """
    guard("rescuer.cdf_spark")
    from rescuer.cdf_spark import get_spark

    return get_spark(jars=jars, master=master)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, guard=guard)
