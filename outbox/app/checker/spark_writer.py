"""The checker's Spark writer (``outbox check --writer spark``): a Spark driver process applying
batches through ``SparkOutbox.apply`` beside the Python writers, on the same table.

One Spark writer per seed: a SparkSession is a JVM, and two per seed would not fit the two cores
the CI seeds share. It opens its session first and journals ``merging`` right before each MERGE
attempt; the supervisor starts the Python writers and workers at the first one, so they commit
while that MERGE runs (a JVM start, and on a loaded machine a first apply, take longer than a
small seed's whole write phase, which would otherwise be over before any batch met it). Each
batch changes a few documents of the Python writers' shared pool (the same documents, the same
buckets: its MERGE races their commits and retries, ``commit_retries``) and documents of its own,
with messages, dispatched immediately through the checker's fault-injecting broker like a Python
writer's. Each apply carries
``txn=(app id, batch)``: a batch replayed after a restart is skipped by Delta, not applied twice.

Its planned fault is the shipped ``after_commit`` crash point on one batch (SIGKILL, or an
escaping exception that restarts the ``SparkOutbox``): the commit happened, nothing was sent, and
only the rescuer (or a later save of a shared document) can deliver that batch's messages. The
fault journals the batch as committed before it fires, so a killed driver's restart resumes after
it; a driver killed in its last batch has nothing left and exits before starting a JVM.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from outbox.app.checker import mutations

APPLY_ATTEMPTS = 5  # a batch whose MERGE lost every commit race is applied again (same txn)
DESTINATION = "shipments"


def open_spark_outbox(spark: Any, cfg: dict[str, Any], transport: Any) -> Any:
    """The driver's ``SparkOutbox`` on the run's workspace (made by the supervisor) and settings;
    also what tests/spark/mixed_child.py drives, so both proofs run the same writer."""
    from outbox.app.spark import SparkOutbox

    return SparkOutbox(
        spark, cfg["workspace"], create=False, transport=transport, **cfg["settings"]
    )


def signal_merges(write: Callable[[dict[str, Any]], None], batch: Callable[[], int]) -> None:
    """Journal each MERGE attempt (``batch``, ``attempt`` from 1) right before it runs: the cue
    for writers meant to commit while a MERGE runs, since a JVM start outlasts a small write
    phase. Wraps the product's ``run_merge``, nothing else."""
    from outbox.app.spark import merge

    real = merge.run_merge
    attempts: Counter[int] = Counter()

    def run_merge(*args: Any, **kwargs: Any) -> dict[str, int]:
        b = batch()
        attempts[b] += 1
        write({"event": "merging", "batch": b, "attempt": attempts[b], "at": time.time()})
        return real(*args, **kwargs)

    setattr(merge, "run_merge", run_merge)  # noqa: B010 - api.py calls M.run_merge


def spark_writer_main(cfg: dict[str, Any]) -> None:
    """Apply batches ``cfg['start']`` .. ``cfg['rounds'] - 1``; journal one ``round`` each."""
    from outbox.app.checker.jvm import add_short_lived_jvm_options
    from outbox.app.checker.procs import _Journal, _log_to, read_journal

    mutation = mutations.get(cfg.get("mutation"))
    if mutation:
        mutation.at_writer_start()
    _log_to(cfg["stderr"])
    # The JVM's chatter (and a failed start's reason) goes to the writer's log, not the CLI's.
    out = os.open(cfg["stderr"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    # A driver of two or three small batches: C1 and the serial GC (outbox.app.checker.jvm); the
    # fork server's environment was fixed before the checker started, so set here, pre-JVM.
    add_short_lived_jvm_options(os.environ)
    journal = _Journal(cfg["journal"])
    events = read_journal(cfg["journal"])
    done = {e["round"] for e in events if e.get("event") == "round" and e.get("saved")}
    todo = [b for b in range(cfg["start"], cfg["rounds"]) if b not in done]
    if not todo:
        journal.write({"event": "done"})
        os._exit(0)  # killed in its last batch: nothing left, no JVM to start
    _SparkWriter(cfg, journal, mutation).run(todo)
    journal.write({"event": "done"})
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (the JVM and deltalake's threads make it slow)


class _SparkWriter:
    def __init__(self, cfg: dict[str, Any], journal: Any, mutation: Any) -> None:
        from outbox.testing.crash_points import crash_points, install
        from rescuer.cdf_spark import find_jars, get_spark

        self.cfg, self.journal, self.mutation = cfg, journal, mutation
        self.batch = -1
        crash_points.disarm()
        install()
        self.crash_points = crash_points
        self._arm(cfg.get("crash", ""))
        jars = find_jars()
        self.spark = get_spark(jars=jars or None)
        self.sob, self.retries = self._open()
        journal.write({"event": "ready", "at": time.time()})
        # the supervisor's cue to start the Python writers (``run._await_ready``)
        signal_merges(journal.write, lambda: self.batch)

    def _arm(self, spec: str) -> None:
        """``point@batch=kill|raise``: fires on that batch's hit (one hit per committed apply)."""
        if not spec:
            return
        from outbox.testing.crash_points import kill_now, raise_crash

        name, _, how = spec.partition("=")
        point, _, nth = name.partition("@")
        kill = (how or "kill") == "kill"

        def fire(hit: str) -> None:
            # The batch committed: journal it first, so a restart resumes after it. (A raise is
            # counted as "writer raise at ..."; a kill as the process's SIGKILL exit.)
            at = time.time()
            self.journal.write({"event": "fired", "point": hit, "spec": spec, "at": at})
            extra = {"killed_at": hit} if kill else {"crash": hit}
            self.journal.write(self._round(saved=True, **extra))
            (kill_now if kill else raise_crash)(hit)

        self.crash_points.arm(point, fire, at_hit=int(nth or 1))

    def _open(self) -> tuple[Any, Any]:
        from outbox.app.checker.procs import _transport
        from outbox.app.checker.retries import RetryCommands

        faulty = _transport(self.cfg, "writer", self.cfg["seed"])
        transport = self.mutation.wrap_transport(faulty) if self.mutation else faulty
        sob = open_spark_outbox(self.spark, self.cfg, transport)
        if self.mutation:
            self.mutation.patch_outbox(sob)
        return sob, RetryCommands(sob.runtime, self.journal)

    def _round(self, *, saved: bool, **extra: Any) -> dict[str, Any]:
        return {
            "event": "round",
            "round": self.batch,
            "saved": saved,
            "occ_retries": 0,
            "stranded": False,
            "spark": True,
            **extra,
        }

    def run(self, batches: list[int]) -> None:
        from outbox.core.errors import OutboxError
        from outbox.testing.crash_points import InjectedCrash

        for b in batches:
            self.batch = b
            before = self.sob.commit_retries
            event: dict[str, Any] = {}
            for attempt in range(APPLY_ATTEMPTS):
                try:
                    r = self.sob.apply(self.frame(b), txn=(self.cfg["app_id"], b))
                    event = self._round(saved=True, version=r.version, skipped=r.skipped)
                    break
                except InjectedCrash:  # committed, then the "process" died: restart it
                    self.sob.close()
                    self.sob, self.retries = self._open()
                    event = {}  # journaled by the crash point already
                    break
                except OutboxError as e:  # every MERGE attempt lost its race: apply it again
                    event = self._round(saved=False, error=type(e).__name__, message=str(e)[:300])
                    event["apply_attempts"] = attempt + 1
            if event:
                event["commit_retries"] = self.sob.commit_retries - before
                self.journal.write(event)
        self.sob.close()

    def frame(self, b: int) -> Any:
        """Batch ``b`` as a DataFrame built in Spark SQL (an inline table: no Python workers)."""
        from outbox.app.spark.ids import sql_str

        rows = []
        for doc_id, msgs in self.cfg["plan"][b]:
            bodies = [
                json.dumps({"doc": doc_id, "writer": self.cfg["index"], "round": b, "k": k})
                for k in range(msgs)
            ]
            messages = ", ".join(
                f"named_struct('type', 'BatchApplied', 'body', {sql_str(body)}, "
                f"'destination', {sql_str(DESTINATION)})"
                for body in bodies
            )
            rows.append(f"({sql_str(doc_id)}, array({messages}))")
        return self.spark.sql(
            "SELECT id, 'package' AS type, CAST(NULL AS STRING) AS state, "
            "CAST(NULL AS BIGINT) AS expected_version, messages "
            f"FROM VALUES {', '.join(rows)} AS t(id, messages)"
        )
