"""The scheduled Spark job's path before the renovation (issue 30) moved it to
``outbox.app.spark.rescue_job``: ``spark-submit .../rescuer/spark_job.py``, ``python -m
rescuer.spark_job`` and a Databricks wheel task calling ``rescuer.spark_job:main`` keep working,
so a job scheduled against an older release does not break on upgrade (issue 43: the paths the
docs showed keep working). The only module of ``rescuer`` that imports the roof, by design; the
layers contract names this one import as allowed.
"""

from __future__ import annotations

import sys

from outbox.app.spark.rescue_job import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
