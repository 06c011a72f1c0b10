"""Spark pipelines write documents and their messages: ``SparkOutbox(spark, ".outbox").apply(df)``.

Needs PySpark and delta-spark (``pip install 'delta-outbox[spark]'``); see docs/spark.md.
"""

from outbox.app.spark.api import ApplyResult, SparkOutbox

__all__ = ["ApplyResult", "SparkOutbox"]
