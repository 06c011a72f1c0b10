"""Which delta-spark errors make ``SparkOutbox.apply`` retry its MERGE (no SparkSession needed).

delta-spark 4.x words a lost race as "[DELTA_CONCURRENT_APPEND...] Transaction conflict detected.
a concurrent MERGE ...": the retry used to look for "Concurrent" in the message and never fired,
so an apply beside busy writers failed at its first lost race (found by test_mixed_writers.py).
"""

from __future__ import annotations

import pytest

from outbox.app.spark.api import _is_commit_conflict
from tests.spark.conftest import _unavailable

pytestmark = pytest.mark.spark


def test_delta_conflicts_are_retried_and_other_errors_are_not() -> None:
    try:
        from delta.exceptions import base
    except ImportError as e:
        _unavailable(f"delta-spark is not installed: {e}")
    message = (
        "[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] Transaction conflict detected. a "
        "concurrent MERGE added data to table outbox_documents committed at version 21."
    )
    for cls in (
        base.ConcurrentAppendException,
        base.ConcurrentDeleteReadException,
        base.ConcurrentDeleteDeleteException,
        base.ConcurrentTransactionException,
        base.ConcurrentWriteException,
        base.DeltaConcurrentModificationException,
    ):
        assert _is_commit_conflict(cls(message=message)), cls
    assert _is_commit_conflict(RuntimeError(message))  # the error class, whatever wraps it
    assert not _is_commit_conflict(base.MetadataChangedException(message="schema changed"))
    assert not _is_commit_conflict(RuntimeError("[DELTA_MISSING_COLUMN] no column x"))
