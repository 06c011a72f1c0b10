"""The suite's SparkSession runs with the suite's Spark settings (``tests/spark_conf``).

``spark-defaults.conf`` reaches a session only through ``SPARK_CONF_DIR`` set before its JVM
starts (``tests/conftest.py``'s ``spark_test_settings``); set later, or read by no launcher, the
settings are silently absent and the Spark tests run at their old cost. So the session is asked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def _defaults(conf_dir: str) -> dict[str, str]:
    """The ``key value`` lines of ``spark-defaults.conf`` in ``conf_dir`` (comments left out)."""
    path = Path(conf_dir) / "spark-defaults.conf"
    lines = path.read_text("utf-8").splitlines() if path.is_file() else []
    pairs = (line.strip().split(None, 1) for line in lines)
    return {p[0]: p[1].strip() for p in pairs if len(p) == 2 and not p[0].startswith("#")}


def test_the_suites_session_reads_the_suites_spark_settings(
    spark: Any, spark_test_settings: str
) -> None:
    from tests.conftest import SPARK_CONF_DIR

    settings = _defaults(spark_test_settings)
    if Path(spark_test_settings) == SPARK_CONF_DIR:
        assert settings, f"{SPARK_CONF_DIR}/spark-defaults.conf holds no setting"
    conf = dict(spark.sparkContext.getConf().getAll())
    for key, value in settings.items():
        if key == "spark.driver.defaultJavaOptions":  # the JVM's own options: ask the JVM
            runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory
            args = list(runtime.getRuntimeMXBean().getInputArguments())
            assert set(value.split()) <= set(args), (key, args)
        else:
            assert conf.get(key) == value, (key, conf.get(key))
        if key.startswith("spark.sql."):
            assert spark.conf.get(key) == value, key
