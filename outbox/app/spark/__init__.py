"""Spark pipelines write documents and their messages: ``SparkOutbox(spark, ".outbox").apply(df)``.

Needs PySpark and delta-spark (``pip install 'delta-outbox[spark]'``); see docs/spark.md.
"""

from outbox.core.shadowing import check_top_level_packages

check_top_level_packages()  # before api imports dispatcher: a user's dispatcher.py is one line

from outbox.app.spark.api import ApplyResult, SparkOutbox  # noqa: E402

__all__ = ["ApplyResult", "SparkOutbox"]
