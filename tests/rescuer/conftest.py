"""Rescuer fixtures: tables written by deltalake, read by either engine, with time injected.

Delta commit timestamps are real wall time, so tests set the ``ManualClock`` relative to the
real commit timestamps (``at(version, +delay)``) instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from outbox.core.clock import ManualClock
from outbox.core.model import DocumentRow
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.planner import Engine
from rescuer.runner import RescuePass
from rescuer.sink import InMemorySink

DELAY = 15.0
JARS_DIR = Path("/tmp/dj")


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """ONE local SparkSession for the whole test session (it takes ~6-8 s to start)."""
    pytest.importorskip("pyspark")
    from outbox.core.errors import EngineError
    from rescuer.cdf_spark import find_jars, get_spark

    jars = find_jars()
    if not jars and JARS_DIR.is_dir():
        jars = sorted(str(p) for p in JARS_DIR.glob("*.jar"))
    try:
        spark = get_spark(jars=jars or None)
    except EngineError as e:
        pytest.skip(f"no Delta JARs for Spark: {e}")
    yield spark
    spark.stop()


@pytest.fixture(params=["local", pytest.param("spark", marks=pytest.mark.spark)])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Every contract test runs on both engines, on the same deltalake-written tables."""
    if request.param == "local":
        return LocalEngine()
    from rescuer.cdf_spark import SparkEngine

    return SparkEngine(request.getfixturevalue("spark_session"))


class Table:
    """A document table plus the helpers a rescue scenario needs."""

    def __init__(self, path: Path) -> None:
        self.uri = str(path)
        DeltaDocumentStore.create(self.uri, buckets=4)
        self.store = DeltaDocumentStore(self.uri)
        self._versions: dict[str, int] = {}

    def put(self, *docs: tuple[str, int]) -> int:
        """Save documents with ``last_seq`` (new ones inserted, others updated) in one commit."""
        writes = []
        read_at = self.store.refresh()
        for doc_id, last_seq in docs:
            have = self._versions.get(doc_id, 0)
            row = DocumentRow(doc_id, "t", have + 1, {}, last_seq, 0, [])
            writes.append(DocumentWrite(row, have, read_at))
        version = self.store.save(writes)
        for doc_id, _ in docs:
            self._versions[doc_id] = self._versions.get(doc_id, 0) + 1
        return version

    def dispatch(self, **marks: int) -> int:
        version = self.store.advance_watermarks(marks)
        assert version is not None
        return version

    def delete(self, doc_id: str) -> int:
        self.store.refresh()
        self.store.delta_table.delete(f"id = '{doc_id}'")
        self._versions.pop(doc_id, None)
        return self.store.refresh()

    def committed_at(self, version: int) -> datetime:
        for entry in self.store.delta_table.history(self.store.version() - version + 1):
            if int(entry["version"]) == version:
                return datetime.fromtimestamp(int(entry["timestamp"]) / 1000, tz=UTC)
        raise AssertionError(f"no commit {version}")

    def at(self, version: int, offset: float) -> datetime:
        """Commit time of ``version`` plus ``offset`` seconds."""
        return self.committed_at(version) + timedelta(seconds=offset)


@pytest.fixture
def table(tmp_path: Path) -> Table:
    return Table(tmp_path / "documents")


@pytest.fixture
def checkpoints() -> InMemoryCheckpointStore:
    return InMemoryCheckpointStore()


@pytest.fixture
def sink() -> InMemorySink:
    return InMemorySink()


@pytest.fixture
def rescuer(
    table: Table,
    engine: Engine,
    checkpoints: InMemoryCheckpointStore,
    sink: InMemorySink,
    clock: ManualClock,
) -> RescuePass:
    return RescuePass(table.store, engine, checkpoints, sink, clock=clock, delay=DELAY)
