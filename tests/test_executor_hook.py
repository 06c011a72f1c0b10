"""The Spark executors' step hook is injected: a partition calls the factory it was given
(``SparkOutbox.executor_hook``) and production gives none, so the executors never import the
testing kit; the fault proofs give ``CrashSpec``. Run here on the partition function itself, with
Arrow batches as ``mapInArrow`` hands them over (no Spark needed: what Spark adds, a SIGKILLed
executor and the rescuer after it, is tests/spark/test_executor_send.py's)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from outbox.app.spark import executors as E
from outbox.core.errors import ConfigurationError
from outbox.core.settings import Settings
from outbox.testing.crash_points import CrashPoints, CrashSpec, InjectedCrash


def _batch(n: int) -> Any:
    """``n`` documents of one pending message each, as ``message_frame`` lays them out."""
    rows = [
        {
            "id": f"doc-{i}",
            "incarnation": "life-1",
            "start": 0,
            "last_seq": 1,
            "seq": 1,
            "message_id": f"msg-{i}",
            "destination": "orders",
            "type": "Placed",
            "body": "{}",
            "content_type": "application/json",
            "headers": "{}",
            "key": f"doc-{i}",
            "correlation_id": None,
            "deliver_at": None,
            "created_at": 0,
        }
        for i in range(n)
    ]
    return pa.RecordBatch.from_pylist(rows)


def _run(tmp_path: Path, hook: E.HookFactory | None) -> list[dict[str, Any]]:
    partition = E._arrow(
        Settings(workspace=tmp_path, transport="memory"), per_document=False, hook=hook
    )
    return [row for out in partition([_batch(3)]) for row in out.to_pylist()]


def test_without_a_hook_the_partition_sends_everything(tmp_path: Path) -> None:
    outcomes = _run(tmp_path, None)
    assert sorted((o["id"], o["sent"], o["failed_seq"]) for o in outcomes) == [
        ("doc-0", 1, None),
        ("doc-1", 1, None),
        ("doc-2", 1, None),
    ]


def test_the_injected_hook_is_built_and_hit_in_the_partition(tmp_path: Path) -> None:
    """The crash armed by the factory fires after the partition's first sent batch: the hook
    reached the executor's code. (Break: the partition ignores ``hook`` and runs NO_HOOK.)"""
    with pytest.raises(InjectedCrash) as crash:
        _run(tmp_path, CrashSpec("executor_sent@1=raise"))
    assert crash.value.point == "executor_sent"


def test_a_hook_travels_pickled_and_arms_a_fresh_registry_each_time() -> None:
    """Spark pickles the partition function with its hook; each partition builds its own points
    (a point fires once per registry, so partitions must not share one)."""
    spec = pickle.loads(pickle.dumps(CrashSpec("executor_sent@2=raise")))
    first, second = spec(), spec()
    assert isinstance(first, CrashPoints)
    assert first is not second
    first.hit("executor_sent")
    with pytest.raises(InjectedCrash):
        first.hit("executor_sent")
    second.hit("executor_sent")  # its own count: the first hit of two


def test_a_malformed_spec_fails_where_it_is_written() -> None:
    """On the driver, with the variable's own one-line error, not later in an executor."""
    with pytest.raises(ConfigurationError, match="is malformed"):
        CrashSpec("executor_sent@x=raise")
    with pytest.raises(ConfigurationError, match="unknown crash point"):
        CrashSpec("nowhere=raise")
