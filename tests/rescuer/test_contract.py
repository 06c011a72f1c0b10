"""The kit's rescuer-engine contract (``outbox.testing.contracts.rescuer_engine``) on the local
engine and on Spark, over the same deltalake-written tables; and the two engines' plans compared."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from outbox.core.clock import ManualClock
from outbox.core.model import DocumentRow, new_incarnation
from outbox.delta.fold import fold_table
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
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


def _random_history(store: DeltaDocumentStore, rng: random.Random, steps: int) -> list[int]:
    """A random history of the versions layout on ``store``; the table versions it made."""
    lives: dict[str, tuple[str | None, list[int]]] = {}  # id -> (incarnation, last_seq by version)
    dead: dict[str, tuple[str | None, list[int]]] = {}  # the same, of deleted documents
    versions = [store.version()]
    for _ in range(steps):
        op = rng.random()
        ids = sorted(rng.sample("abcde", rng.randint(1, 3)))
        if op < 0.45:
            read_at = store.refresh()
            writes = []
            for i in ids:
                life, seqs = lives.get(i, (rng.choice([None, new_incarnation()]), []))
                seq = (seqs[-1] if seqs else 0) + rng.randint(0, 2)
                row = DocumentRow(i, "t", len(seqs) + 1, {}, seq, 0, [], incarnation=life)
                writes.append(DocumentWrite(row, len(seqs), read_at))
                lives[i] = (life, [*seqs, seq])
            versions.append(store.save(writes))
        elif op < 0.8:
            i = ids[0]
            if i not in lives and i not in dead:
                continue
            late = i in dead and (i not in lives or rng.random() < 0.3)  # of a deleted life
            life, seqs = dead[i] if late else lives[i]
            at = rng.randint(1, len(seqs))  # the version the messages were sent from
            seq = rng.randint(max(0, seqs[at - 1] - 1), seqs[at - 1])
            known = late or rng.random() < 0.7  # the life it names, or the current one
            done = store.advance_watermarks({i: seq}, {i: life} if known else None)
            if done is not None:
                versions.append(done)
        elif op < 0.9:
            fold_table(store, at=0)
            versions.append(store.refresh())
        elif ids[0] in lives:
            store.refresh()
            store.delta_table.delete(f"id = '{ids[0]}'")
            dead[ids[0]] = lives.pop(ids[0])
            versions.append(store.refresh())
    return sorted(set(versions))


@pytest.mark.spark
def test_engines_agree_on_the_versions_layout(tmp_path: Path, spark_session: Any) -> None:
    """Random histories of the versions layout (saves appending versions, mark rows sent from
    the newest or an older version, folds, deletes and re-creations as a new life, late marks of
    a deleted life): over many windows and sweeps, the local and Spark plans are identical."""
    from rescuer.cdf_spark import SparkEngine
    from rescuer.planner import FeedWindow

    uri = str(tmp_path / "documents")
    DeltaDocumentStore.create(uri, buckets=2)
    # Seed 2's history tells apart each wrong rule tried on the local engine (deletes ignored,
    # any delete ending a document, the newest by commit, a watermark across lives, the life
    # picked by document rows only).
    rng = random.Random(2)
    versions = _random_history(DeltaDocumentStore(uri), rng, 70)
    local, spark = LocalEngine(), SparkEngine(spark_session)
    latest = versions[-1]
    windows = [FeedWindow(versions[0], latest, latest)]
    for _ in range(10):
        start, end = sorted(rng.sample(versions, 2))
        windows.append(FeedWindow(start, end, rng.choice([v for v in versions if v >= end])))
    for window in windows:
        a, b = local.plan_feed(uri, window), spark.plan_feed(uri, window)
        assert a.key() == b.key(), window
    for v in [*rng.sample(versions, 3), latest]:
        assert local.plan_sweep(uri, v).key() == spark.plan_sweep(uri, v).key(), v
    assert local.plan_sweep(uri, latest).pending  # the history left some documents pending
