"""The kit's rescuer-engine contract (``outbox.testing.contracts.rescuer_engine``) on the local
engine and on Spark, over the same deltalake-written tables; and the two engines' plans compared."""

from __future__ import annotations

from typing import Any

import pytest

from outbox.core.clock import ManualClock
from outbox.testing.contracts.rescuer_engine import RescuerEngineContract
from rescuer.cdf_local import LocalEngine
from rescuer.planner import Engine, PendingDocument
from tests.rescuer.conftest import Table


class TestLocalEngine(RescuerEngineContract):
    def make_engine(self) -> Engine:
        return LocalEngine()


@pytest.mark.spark
class TestSparkEngine(RescuerEngineContract):
    @pytest.fixture(autouse=True)
    def _spark(self, spark_session: Any) -> None:
        self.spark = spark_session

    def make_engine(self) -> Engine:
        from rescuer.cdf_spark import SparkEngine

        return SparkEngine(self.spark)


@pytest.mark.spark
def test_engines_agree_on_plans(table: Table, spark_session: Any, clock: ManualClock) -> None:
    """The same table, window and tail: the local and Spark plans are identical."""
    from rescuer.cdf_spark import SparkEngine
    from rescuer.planner import FeedWindow

    start = table.put(("a", 1), ("b", 1), ("c", 1), ("d", 2))
    table.dispatch(a=1)
    table.put(("b", 2), ("e", 1))
    end = table.delete("c")
    table.dispatch(b=2)  # the tail
    latest = table.put(("d", 5), ("f", 1))
    local, spark = LocalEngine(), SparkEngine(spark_session)
    window = FeedWindow(start, end, latest)
    a, b = local.plan_feed(table.uri, window), spark.plan_feed(table.uri, window)
    assert a.key() == b.key()
    assert a.pending == (PendingDocument("e", 1, 0),)  # d changed only at the start (excluded)
    full = FeedWindow(0, latest, latest)
    assert local.plan_feed(table.uri, full).key() == spark.plan_feed(table.uri, full).key()
    assert local.plan_sweep(table.uri, latest).key() == spark.plan_sweep(table.uri, latest).key()
