"""The processes of the mixed-writers proof (``test_mixed_writers.py``), one role each.

``python -m tests.spark.mixed_child spark CONFIG``: a Spark driver applying the planned batches
through ``SparkOutbox.apply`` (immediate dispatch to the checker's file broker), each with
``txn=(app id, batch)`` so a restarted driver does not apply a batch twice. It journals a
``start`` line before each apply and a ``batch`` line after it; ``OUTBOX_CRASH_AT`` arms the
shipped crash points (``after_commit@3=kill``: SIGKILL right after batch 3 committed, before its
dispatch). It resumes after the last journaled batch.

``python -m tests.spark.mixed_child own|overlap CONFIG``: an application saving through
``unit_of_work``, a burst of saves each time the driver starts a batch's MERGE (the driver
journals a ``merging`` line right before each attempt; the first attempt is the cue): ``own``
on documents of its own (bucket 0, beside the MERGEs on buckets 1-3), ``overlap`` on some of
the driver's documents, so they commit while that MERGE runs on the same buckets and it loses
the race and retries. Both journal every save
that committed; they are never killed, so the journals are exact. Bursts, not a continuous
stream: every commit is one more log entry each Spark action replays (no checkpoint between
deltalake commits), and a stream of them slows the driver's MERGE to minutes.

Waits are on a condition with a deadline (the driver's journal), never a fixed sleep. The
driver's ``SparkOutbox`` and MERGE cue, and the journals, are the checker's own
(``outbox.app.checker.spark_writer``, ``procs``): this proof drives the writer the checker runs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from outbox.app.checker.procs import _Journal, read_journal

DEADLINE_S = 1800.0  # a safety net only: the writers stop when the driver is done


def _transport(cfg: dict[str, Any], role: str) -> Any:
    from outbox.app.checker.broker import LogTransport

    return LogTransport(cfg["log"], role=role)


def spark_main(cfg: dict[str, Any]) -> None:
    from outbox.app.checker.spark_writer import open_spark_outbox, signal_merges
    from outbox.testing import crash_points
    from rescuer.cdf_spark import get_spark

    crash_points.install()  # OUTBOX_CRASH_AT is read at the first hit
    journal = _Journal(cfg["spark_journal"])
    current = [0]
    signal_merges(journal.write, lambda: current[0])  # the writers' cue: attempt 1
    done = {int(e["batch"]) for e in read_journal(cfg["spark_journal"]) if e["event"] == "batch"}
    spark = get_spark()
    sob = open_spark_outbox(spark, cfg, _transport(cfg, "spark"))
    for b in range(1, cfg["batches"] + 1):
        if b in done:
            continue
        df = _batch(spark, cfg, b)
        current[0] = b
        journal.write({"event": "start", "batch": b, "at": time.time()})
        r = sob.apply(df, txn=(cfg["app_id"], b))
        journal.write(
            {
                "event": "batch",
                "batch": b,
                "version": r.version,
                "skipped": r.skipped,
                "written": r.written,
                "conflicts": r.conflicts.count(),
                "commit_retries": sob.commit_retries,
                "timings": r.timings,
            }
        )
    journal.write({"event": "done"})
    sob.close()
    spark.stop()


def _batch(spark: Any, cfg: dict[str, Any], b: int) -> Any:
    """Batch ``b``: every driver document, one message each, state kept (null), built in Spark
    SQL from a range (the test computes the same ids in Python: ``SPARK_DOCS``)."""
    from outbox.app.spark.ids import bucket_sql

    body = f"""concat('{{"doc":"', id, '","b":{b}}}')"""
    return (
        spark.range(cfg["spark_range"])
        .selectExpr("concat('sp-', lpad(cast(id as string), 5, '0')) as id")
        .filter(f"{bucket_sql('id', cfg['settings']['buckets'])} != 0")
        .selectExpr(
            "id",
            "'shipment' as type",
            "cast(null as string) as state",
            "cast(null as bigint) as expected_version",
            f"array(named_struct('type', 'Scanned', 'body', {body})) as messages",
        )
    )


def _save(ob: Any, doc_id: str, journal: _Journal, role: str) -> None:
    """One unit of work on ``doc_id`` (one message), retried on a lost race; journaled once it
    committed."""
    from outbox.core.errors import CommitConflictError, ConcurrencyError

    for _ in range(50):
        try:
            with ob.unit_of_work() as uow:
                doc = uow.get(doc_id) or uow.create(doc_id, type="shipment")
                doc.state["py"] = int(doc.state.get("py", 0)) + 1
                doc.send("Touched", {"doc": doc_id, "n": doc.state["py"], "by": role})
        except (ConcurrencyError, CommitConflictError):
            continue
        journal.write({"event": "save", "doc": doc_id, "messages": 1})
        return
    raise RuntimeError(f"{role}: 50 lost races in a row on {doc_id}")


def _spark_events(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return read_journal(cfg["spark_journal"])


def writer_main(cfg: dict[str, Any], role: str) -> None:
    """A burst of ``burst`` saves each time the driver starts a MERGE: the application's own
    documents (``own``), or the driver's overlapping ones (``overlap``), whose saves then commit
    while that MERGE runs on the same buckets."""
    from outbox.app.facade import Outbox

    journal = _Journal(cfg[f"{role}_journal"])
    docs: list[str] = cfg[f"{role}_docs"]
    deadline = time.monotonic() + DEADLINE_S
    seen = 0
    with Outbox.open(
        cfg["workspace"], create=False, transport=_transport(cfg, "writer"), **cfg["settings"]
    ) as ob:
        i = 0
        while time.monotonic() < deadline:
            events = _spark_events(cfg)
            cues = sum(1 for e in events if e["event"] == "merging" and e["attempt"] == 1)
            if cues > seen:
                seen = cues
                for _ in range(cfg["burst"]):
                    _save(ob, docs[i % len(docs)], journal, role)
                    i += 1
            elif any(e["event"] == "done" for e in events):
                break
            else:
                time.sleep(0.02)  # polling the driver's journal for its next MERGE
    journal.write({"event": "done"})


def main(argv: list[str]) -> None:
    role, config = argv
    cfg = json.loads(Path(config).read_text("utf-8"))
    if role == "spark":
        spark_main(cfg)
    else:
        writer_main(cfg, role)


if __name__ == "__main__":
    main(sys.argv[1:])
