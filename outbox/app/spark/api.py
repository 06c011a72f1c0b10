"""``SparkOutbox``: a Spark pipeline changes documents and emits their messages atomically.

``apply(changes)`` is one Delta commit through delta-spark (see ``outbox.app.spark.merge``),
checked first (``outbox.app.spark.validate``) and dispatched after (``outbox.app.spark.dispatch``),
with the same settings, ids, transport and dispatcher as ``Outbox.open`` (docs/spark.md).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from dispatcher.dispatch import DispatchReport
from dispatcher.runtime import DispatcherRuntime
from dispatcher.transports.base import Transport
from outbox.app.spark import dispatch as D
from outbox.app.spark import executors as E
from outbox.app.spark import merge as M
from outbox.app.spark import views
from outbox.app.spark.executors import HookFactory, SendFrom
from outbox.app.spark.session import require_delta
from outbox.app.spark.validate import check_rows, normalize
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import ClosedError, CommitConflictError, StoreError, ValidationError
from outbox.core.model import DocumentRow
from outbox.core.settings import Settings
from outbox.core.shutdown import close_at_exit
from outbox.delta.versions import MARK_VERSION
from outbox.wiring import Backends
from rescuer.cdf_spark import hadoop_options

log = logging.getLogger("outbox.app.spark")

DispatchChoice = Literal["immediate", "deferred"]
CONFLICT_SCHEMA = "id string, expected_version bigint, current_version bigint"


@dataclass
class ApplyResult:
    """What one ``apply`` did. ``conflicts`` is a DataFrame (id, expected_version,
    current_version: null when the document does not exist) of the rows *not* written."""

    version: int | None  # the commit; None when nothing was committed
    rows: int
    written: int
    messages: int
    conflicts: Any
    skipped: bool = False  # a replayed transaction (txn) that Delta had already applied
    dispatch: DispatchReport | None = None
    timings: dict[str, float] = field(default_factory=dict)


class SparkOutbox:
    """The outbox's write path for Spark: ``apply`` a DataFrame of document changes."""

    def __init__(
        self,
        spark: Any,
        workspace: str | Path | None = None,
        *,
        settings: Settings | None = None,
        transport: Transport | str | None = None,
        clock: Clock | None = None,
        create: bool = True,
        send_from: SendFrom = "auto",
        **overrides: Any,
    ) -> None:
        """Settings resolve as in ``Outbox.open`` (arguments > ``OUTBOX_*`` > file > defaults);
        ``transport``: a name or a ``Transport``; ``spark`` must have Delta Lake (checked first:
        ``outbox.spark.local_session``). ``send_from``: where immediate dispatch sends a commit's
        messages: ``executors`` (each partition its own), ``driver``, or ``auto`` (``E.choose``)."""
        require_delta(spark)  # before the workspace exists and any Spark job runs
        if isinstance(transport, str):
            overrides["transport"] = transport
            transport = None
        if settings is None:
            settings = Settings.load(workspace, **overrides)
        elif overrides:
            settings = settings.replace(**overrides)
        self.send_from: SendFrom = E.choose(send_from, transport, settings)
        self.spark = spark
        self.settings = settings
        self.clock = clock or SystemClock()
        self.backends = Backends(settings, clock=self.clock, transport=transport, spark=spark)
        if create:
            self.backends.migrate(only_if_missing=True)
        # deltalake's store validates the table, knows N and the table id, writes watermarks.
        self.store = self.backends.document_store(clock=self.clock)
        self.runtime = DispatcherRuntime(self.store, settings, self.backends, clock=self.clock)
        self._options = hadoop_options(settings.storage_options)
        self._closed = False
        close_at_exit(self)  # its threads stop before the interpreter finalizes
        #: MERGE attempts lost to a concurrent writer's commit and retried (all applies).
        self.commit_retries = 0
        #: Builds each executor partition's step hook (``executor_sent``): None in production;
        #: the fault proofs set ``outbox.testing.crash_points.CrashSpec("executor_sent@1=kill")``.
        self.executor_hook: HookFactory | None = None

    # --- the write ------------------------------------------------------------------------

    @property
    def table_uri(self) -> str:
        return self.settings.table_uri

    def _target(self) -> Any:
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self.spark, self.table_uri, hadoopConf=self._options)

    def _reader(self) -> Any:
        return self.spark.read.format("delta").options(**self._options)

    def apply(
        self,
        changes: Any,
        *,
        dispatch: DispatchChoice | None = None,
        txn: tuple[str, int] | None = None,
    ) -> ApplyResult:
        """Apply ``changes`` in one Delta commit, then dispatch that commit's messages.

        ``txn=(app_id, version)`` makes the commit idempotent: a later apply with the same app id
        and a version at or below one already committed writes nothing (``result.skipped``).
        ``dispatch`` overrides ``settings.dispatch`` for this call.
        """
        if self._closed:
            raise ClosedError("this SparkOutbox is closed", hint="create a new SparkOutbox")
        from pyspark import StorageLevel

        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        now = self.clock.now()
        source = normalize(
            changes,
            buckets=self.store.buckets,
            default_destination=self.settings.default_destination,
            created_at=now,
        ).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            checked = check_rows(source, max_message_bytes=self.settings.max_message_bytes)
            timings["validate_s"] = time.perf_counter() - t0
            if checked.rows == 0:
                return ApplyResult(None, 0, 0, 0, self._no_conflicts(), timings=timings)
            token = f"outbox-apply-{uuid.uuid4().hex}"
            confs = {M.USER_METADATA: token}
            if txn is not None:
                confs |= {M.TXN_APP_ID: _check_app_id(txn[0]), M.TXN_VERSION: str(int(txn[1]))}
            target = self._target()
            t1 = time.perf_counter()
            metrics = self._merge(
                target, source, buckets=checked.buckets, token=token, confs=confs, now=now
            )
            timings["merge_s"] = time.perf_counter() - t1
            written = metrics.get("num_updated_rows", 0) + metrics.get("num_inserted_rows", 0)
            t2 = time.perf_counter()
            version = M.find_commit(target, token)
            timings["commit_lookup_s"] = time.perf_counter() - t2
            # A skipped MERGE returns no metrics row; a MERGE that ran but changed nothing may
            # not commit either, so with no metrics to tell, no commit + nothing written is
            # taken as the skip (the only difference: such a replay reports no conflicts).
            if txn is not None and (not metrics or (version is None and written == 0)):
                log.info("transaction %s/%s was applied before; skipped", txn[0], txn[1])
                return ApplyResult(
                    None, checked.rows, 0, 0, self._no_conflicts(), skipped=True, timings=timings
                )
            conflicts = self._no_conflicts()
            if written < checked.rows:
                conflicts = self._conflicts(source, version)
            result = ApplyResult(version, checked.rows, written, 0, conflicts, timings=timings)
        finally:
            source.unpersist()
        if version is not None:
            t3 = time.perf_counter()
            result.dispatch, result.messages = self._after_commit(version, dispatch, timings)
            timings["dispatch_s"] = time.perf_counter() - t3
        timings["total_s"] = time.perf_counter() - t0
        return result

    def _merge(
        self,
        target: Any,
        source: Any,
        *,
        buckets: list[int],
        token: str,
        confs: dict[str, str],
        now: Any,
    ) -> dict[str, int]:
        """The MERGE, retried when a concurrent writer committed to the same files first, or
        changed a document after its newest version was read (``merge.with_newest``).

        A retry is safe: it reads the newest versions again, the MERGE recomputes everything
        else from the target it reads, and a failed attempt committed nothing.
        """
        from pyspark import StorageLevel

        attempts = self.settings.max_commit_retries + 1
        for attempt in range(attempts):
            # Read and kept once per attempt, before the MERGE: the MERGE's clauses test what
            # this read saw (a source evaluated again could see another snapshot), and a source
            # reading the target inside the MERGE's transaction could count, for Delta's
            # conflict detection, as a read of the whole table, not of the touched buckets.
            newest = M.with_newest(source, self._reader().load(self.table_uri), buckets)
            newest = newest.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                newest.count()
                with M.session_confs(self.spark, confs):
                    return M.run_merge(
                        target,
                        newest,
                        table_id=self.store.table_id,
                        buckets=buckets,
                        token=token,
                        now_sql=f"timestamp_micros({_micros(now)})",
                    )
            except Exception as e:
                retry = _is_commit_conflict(e) or M.is_stale_newest(e)
                if not retry:
                    raise _spark_error(f"the MERGE into {self.table_uri} failed", e) from e
                if attempt == attempts - 1:
                    raise CommitConflictError(
                        f"the MERGE into {self.table_uri} lost a race to concurrent writers "
                        f"{attempts} times: {_first_line(e)}",
                        hint="apply again (nothing was committed), or raise max_commit_retries",
                    ) from e
                log.debug("MERGE lost a race (attempt %d): %s", attempt + 1, e)
                self.commit_retries += 1
            finally:
                newest.unpersist()
            self.clock.sleep(0.05 * 2 ** min(attempt, 5) * (0.5 + random.random()))
        raise AssertionError("unreachable")  # pragma: no cover

    def _no_conflicts(self) -> Any:
        return self.spark.createDataFrame([], CONFLICT_SCHEMA)

    def _conflicts(self, source: Any, version: int | None) -> Any:
        """Source rows the commit did not write, with the document's version at that commit
        (its newest row's: the table holds a row per version, and mark rows)."""
        from pyspark.sql import functions as F

        reader = self._reader()
        current = (reader.option("versionAsOf", version) if version is not None else reader).load(
            self.table_uri
        )
        missed = source.select("id", "_expected", "bucket")
        if version is not None:
            wrote = D.commit_frame(self._reader(), self.table_uri, version).select("id")
            missed = missed.join(wrote, "id", "left_anti")
        newest = (
            current.filter(F.col("version") > MARK_VERSION)  # a mark row is no document
            .groupBy("id", "bucket")
            .agg(F.max("version").alias("version"))
        )
        return (
            missed.alias("s")
            .join(
                newest.alias("t"),
                (F.col("s.id") == F.col("t.id")) & (F.col("s.bucket") == F.col("t.bucket")),
                "left",
            )
            .select(
                F.col("s.id").alias("id"),
                F.col("s._expected").alias("expected_version"),
                F.col("t.version").alias("current_version"),
            )
            .localCheckpoint(eager=True)
        )

    # --- after the commit -----------------------------------------------------------------

    documents, register_view = views.documents, views.register_view  # docs/readers.md

    def pending_in_commit(self, version: int) -> list[DocumentRow]:
        """The documents commit ``version`` left pending, from its change data only."""
        return D.pending_rows(D.commit_frame(self._reader(), self.table_uri, version))

    def _after_commit(
        self, version: int, dispatch: DispatchChoice | None, timings: dict[str, float]
    ) -> tuple[DispatchReport | None, int]:
        """Hand the commit's pending documents to the dispatcher runtime; never raises (I4)."""
        mode = dispatch or self.settings.dispatch
        if mode == "immediate" and self.send_from == "executors":
            return E.dispatch_commit(self, version, timings)
        t0 = time.perf_counter()
        try:
            rows = self.pending_in_commit(version)
            timings["read_changes_s"] = time.perf_counter() - t0
        except Exception:
            log.exception("reading commit %d's changes failed; the rescuer will cover it", version)
            self.runtime.observe.committed()
            return None, 0
        count = sum(len(r.outbox) for r in rows)
        if mode == self.runtime.mode:
            self.runtime.after_commit(rows, version)
            return (self.runtime.last_report if mode == "immediate" else None), count
        self.runtime.crash_points.hit("after_commit")
        if mode == "deferred":
            self.runtime.enqueue_commands((r.id, r.last_seq, r.incarnation) for r in rows)
            return None, count
        report = self.runtime.dispatcher.dispatch(rows)
        if report.failed:
            by_id = {r.id: r for r in rows}
            self.runtime.enqueue_commands(
                ((d, by_id[d].last_seq, by_id[d].incarnation) for d in report.failed),
                delay=self.runtime.retry_delay,
            )
        return report, count

    # --- streaming ------------------------------------------------------------------------

    def foreach_batch(
        self,
        app_id: str,
        *,
        dispatch: DispatchChoice | None = None,
        on_result: Callable[[int, ApplyResult], None] | None = None,
    ) -> Callable[[Any, int], None]:
        """A ``foreachBatch`` function that applies each micro-batch exactly once.

        ``app_id`` names the streaming query for Delta's idempotent writes; keep it stable
        across restarts of the same query (with the same checkpoint) and unique per query.
        A micro-batch replayed after a driver restart has the same ``batchId`` and is skipped.
        ``on_result(batch_id, result)`` sees every batch's ``ApplyResult`` (metrics, conflicts).
        """
        _check_app_id(app_id)

        def apply_batch(batch: Any, batch_id: int) -> None:
            result = self.apply(batch, dispatch=dispatch, txn=(app_id, int(batch_id)))
            if on_result is not None:
                on_result(int(batch_id), result)

        return apply_batch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.runtime.close()
        self.backends.close()
        self.store.close()

    def __enter__(self) -> SparkOutbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _micros(now: Any) -> int:
    return int(now.timestamp() * 1_000_000)


def _is_commit_conflict(e: Exception) -> bool:
    """A concurrent writer's commit beat this one: retry. Decided by delta-spark's exception
    classes, with the error class as a fallback. (Not by "Concurrent" in the message: delta-spark
    4.x says "[DELTA_CONCURRENT_APPEND...] Transaction conflict detected. a concurrent MERGE ...",
    and a check on the capitalised word never retried; the mixed-writers test found it.)"""
    try:
        from delta.exceptions import base
    except ImportError:  # pragma: no cover - delta-spark is what raised it
        return "DELTA_CONCURRENT_" in str(e)
    if isinstance(
        e,
        (
            base.DeltaConcurrentModificationException,
            base.ConcurrentWriteException,
            base.ConcurrentAppendException,
            base.ConcurrentDeleteReadException,
            base.ConcurrentDeleteDeleteException,
            base.ConcurrentTransactionException,
        ),
    ):
        return True
    return "DELTA_CONCURRENT_" in str(e) or "ConcurrentAppendException" in str(e)


def _check_app_id(app_id: str) -> str:
    if not isinstance(app_id, str) or not app_id.strip():
        raise ValidationError(f"the transaction app id must be a non-empty string, got {app_id!r}")
    return app_id


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _spark_error(what: str, e: Exception) -> StoreError:
    return StoreError(f"{what}: {_first_line(e)}")
