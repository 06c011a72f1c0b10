"""The Spark engine: the same plan as ``cdf_local``, computed as a Spark job (delta-spark).

Why Spark at all: for tables beyond one machine, or where the job already runs on Databricks.
The planning runs in Spark end to end, by the rule of ``cdf_local`` (the versions layout: a
document is its life's newest version, its watermark the highest of that life's rows):
aggregations with ``max_by`` pick each id's document from the feed (``feed_plan``), and the sweep
(``sweep_frame``) runs the window query of ``outbox.delta.current`` as Spark SQL; only the pending
ids (a few rows) come back to the driver; the feed itself is never collected.

Where the Delta JARs come from, in order:
1. an active SparkSession that already has Delta (a Databricks runtime has it built in);
2. ``OUTBOX_DELTA_JARS``: comma-separated JAR files or folders;
3. ``<repo>/.cache/jars`` (or ``./.cache/jars``), filled by ``scripts/fetch-jars.sh`` from Maven.
Without any of them the engine fails with ``EngineError`` saying exactly that.

Why one module: the session (JARs, options, the one shared session), the feed plan and the sweep
are one engine behind one ``Engine`` protocol, and the plan's Spark expressions are read against
``cdf_local``'s Arrow rule side by side; splitting them would put the rule's two halves (feed and
sweep) in different files from the session they need.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from outbox.core.errors import EngineError, MissingDependencyError
from outbox.delta.versions import MARK_VERSION, pending_sql
from rescuer.planner import (
    FEED_COLUMNS,
    FeedWindow,
    Plan,
    feed_unavailable,
    first_line,
    pending_from_rows,
    sweep_plan,
)

JARS_ENV = "OUTBOX_DELTA_JARS"
REPO_ROOT = Path(__file__).resolve().parents[1]
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

#: Fragments of Spark/Delta errors that mean "the history this window needs is gone".
_GONE = (
    "DELTA_CHANGE_DATA_FILE_NOT_FOUND",
    "DELTA_MISSING_CHANGE_DATA",
    "DELTA_VERSION_NOT_FOUND",
    "DELTA_FILE_NOT_FOUND",
    "DELTA_CANNOT_TIME_TRAVEL",
    # a version older than the table's deletedFileRetentionDuration: delta-spark refuses to read
    # its change feed even while its files are still there
    "DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION",
    "VersionNotFoundException",
    "FileNotFoundException",
    "FILE_NOT_EXIST",
    "change data was not recorded",
    "does not exist",
)

_HOW_TO_GET_JARS = (
    "run scripts/fetch-jars.sh (downloads delta-spark and delta-storage from Maven Central into "
    ".cache/jars), or set OUTBOX_DELTA_JARS to the JAR files or their folder, or run on a "
    "Databricks runtime, which has Delta built in"
)

_session_lock = threading.Lock()

log = logging.getLogger("outbox.rescuer")

#: delta-rs (object_store) credential keys -> the Hadoop options Spark's file systems read.
#: A DataFrame reader option whose name starts with ``fs.`` is applied by Delta to the Hadoop
#: configuration of that read, so credentials need no session-wide (``spark.hadoop.*``) setting.
_S3A = {
    "aws_access_key_id": "fs.s3a.access.key",
    "aws_secret_access_key": "fs.s3a.secret.key",
    "aws_session_token": "fs.s3a.session.token",
    "aws_endpoint_url": "fs.s3a.endpoint",
    "aws_endpoint": "fs.s3a.endpoint",
    "aws_region": "fs.s3a.endpoint.region",
}
_AZURE_ACCOUNT = ("azure_storage_account_name", "account_name")
_AZURE_KEY = ("azure_storage_account_key", "azure_storage_access_key", "account_key")


def hadoop_options(storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """The Spark reader options for the settings' ``storage_options``.

    Keys already in Hadoop form (``fs.*``) pass through; the common delta-rs keys are translated
    (S3 access key, secret, session token, endpoint, region; an Azure account name plus key
    becomes ``fs.azure.account.key.<account>.dfs.core.windows.net``). Anything else (a SAS token,
    a service principal, ``allow_http``...) has no one-to-one Hadoop option: it is left out and
    its *name* is logged; configure it on the cluster (a Databricks runtime usually has the
    credentials already). Values are never logged.
    """
    out: dict[str, str] = {}
    skipped: list[str] = []
    lowered = {k.lower(): (k, v) for k, v in (storage_options or {}).items()}
    account = next((lowered[k][1] for k in _AZURE_ACCOUNT if k in lowered), None)
    for low, (key, value) in lowered.items():
        if key.startswith("fs."):
            out[key] = value
        elif low in _S3A:
            out[_S3A[low]] = value
        elif low in _AZURE_KEY and account:
            out[f"fs.azure.account.key.{account}.dfs.core.windows.net"] = value
        elif low not in _AZURE_ACCOUNT:
            skipped.append(key)
    if skipped:
        log.warning(
            "the Spark engine has no Hadoop equivalent for storage option(s) %s; configure "
            "them on the Spark cluster",
            ", ".join(sorted(skipped)),
        )
    return out


def find_jars(env: Mapping[str, str] | None = None, roots: list[Path] | None = None) -> list[str]:
    """Delta JAR paths from ``OUTBOX_DELTA_JARS`` or ``.cache/jars``; [] when there are none.

    A configured ``OUTBOX_DELTA_JARS`` that holds no delta-spark JAR is an error, not a silent
    fall-through: the user asked for those JARs.
    """
    env = os.environ if env is None else env
    configured = env.get(JARS_ENV, "").strip()
    if configured:
        jars: list[str] = []
        for part in (p.strip() for p in configured.split(",") if p.strip()):
            path = Path(part).expanduser()
            if path.is_dir():
                jars += sorted(str(j) for j in path.glob("*.jar"))
            elif path.is_file():
                jars.append(str(path))
        if not any(Path(j).name.startswith("delta-spark") for j in jars):
            raise EngineError(
                f"{JARS_ENV}={configured!r} names no delta-spark JAR",
                hint=_HOW_TO_GET_JARS,
            )
        return jars
    for root in roots if roots is not None else [REPO_ROOT, Path.cwd()]:
        found = sorted(str(j) for j in (root / ".cache" / "jars").glob("*.jar"))
        if any(Path(j).name.startswith("delta-spark") for j in found):
            return found
    return []


_HOW_TO_GET_JAVA = (
    "install Java 17 (e.g. apt-get install openjdk-17-jre-headless) and set JAVA_HOME to it, "
    "or unset JAVA_HOME to use the java on PATH"
)


def check_local_spark(jars: list[str], env: Mapping[str, str] | None = None) -> None:
    """Before a local Spark starts: a broken JAR or a missing Java otherwise shows up as 40 lines
    of ``ClassNotFoundException`` or ``spark-class: CMD: bad array subscript`` and a dead Py4J
    gateway. Both are checked here, each as one error naming the file and the fix."""
    env = os.environ if env is None else env
    for jar in jars:
        path = Path(jar)
        if not path.is_file() or path.stat().st_size == 0 or not zipfile.is_zipfile(path):
            raise EngineError(
                f"the Delta JAR {path} is empty or not a JAR file (an interrupted download?)",
                hint="delete it and run scripts/fetch-jars.sh again (or point OUTBOX_DELTA_JARS "
                "at good copies)",
            )
    java_home = env.get("JAVA_HOME", "")
    if java_home:
        if not (Path(java_home) / "bin" / "java").is_file():
            raise EngineError(
                f"JAVA_HOME={java_home} has no bin/java: Spark cannot start",
                hint=_HOW_TO_GET_JAVA,
            )
    elif shutil.which("java", path=env.get("PATH")) is None:
        raise EngineError(
            "no Java found (JAVA_HOME is not set and java is not on PATH): Spark cannot start",
            hint=_HOW_TO_GET_JAVA,
        )


def _has_delta(session: Any) -> bool:
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return True
    try:
        extensions = session.conf.get("spark.sql.extensions", "") or ""
    except Exception:  # pragma: no cover - a Connect session without that key
        return False
    return DELTA_EXTENSION in extensions


def delta_jars(
    env: Mapping[str, str] | None = None,
    roots: list[Path] | None = None,
    *,
    jars: list[str] | None = None,
) -> list[str]:
    """The Delta JARs a local session loads (``jars``, else ``find_jars``), checked with Java
    before any JVM starts (``check_local_spark``); ``EngineError`` saying where to get them when
    there are none. ``outbox rescue --engine spark`` and the scheduled job
    (``outbox-rescue-spark``) both find them here."""
    jars = find_jars(env, roots) if jars is None else jars
    if not jars:
        raise EngineError(
            "the Spark engine cannot find the Delta Lake JARs "
            "(delta-spark_4.2_2.13-4.4.0.jar and delta-storage-4.4.0.jar)",
            hint=_HOW_TO_GET_JARS,
        )
    check_local_spark(jars, env)
    return jars


def local_session_config(jars: list[str], master: str = "local[2]") -> dict[str, str]:
    """The configuration of a local SparkSession with Delta: the JARs, Delta's extension and
    catalog, and small-machine settings (no UI, two partitions, UTC)."""
    return {
        "spark.master": master,
        "spark.app.name": "outbox-rescuer",
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        # Delta rebuilds a snapshot with 50 partitions by default: pure overhead locally.
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": "-Dlog4j.rootLogger=ERROR",
    }


def start_session(config: Mapping[str, str]) -> Any:
    """A SparkSession built with ``config`` (one per process: ``getOrCreate``); a failure to
    start is an ``EngineError``."""
    from pyspark.sql import SparkSession

    # The executors' Python workers (a Spark pipeline sending from its executors) run this
    # interpreter, with the outbox's packages, unless PYSPARK_PYTHON says otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        session = SparkSession.builder.config(map=dict(config)).getOrCreate()
    except Exception as e:
        raise EngineError(f"starting a local SparkSession failed: {e}") from e
    session.sparkContext.setLogLevel("ERROR")
    return session


def get_spark(
    *,
    jars: list[str] | None = None,
    master: str = "local[2]",
    env: Mapping[str, str] | None = None,
    roots: list[Path] | None = None,
) -> Any:
    """The active SparkSession when it has Delta; else a local one built with the Delta JARs.

    One session per process: starting one takes ~6-8 s, so tests and the scheduler reuse it.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise MissingDependencyError(
            "the Spark engine needs PySpark and delta-spark",
            hint="pip install 'delta-outbox[spark]'",
        ) from e
    with _session_lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            if _has_delta(active):
                return active
            raise EngineError(
                "the active SparkSession was built without Delta "
                f"(spark.sql.extensions lacks {DELTA_EXTENSION})",
                hint="build it with the Delta extension and catalog and the Delta JARs: "
                + _HOW_TO_GET_JARS,
            )
        return start_session(local_session_config(delta_jars(env, roots, jars=jars), master))


def _translate(uri: str, what: str, e: Exception, window: FeedWindow | None) -> Exception:
    text = str(e)
    first = first_line(e)
    if "DATA_SOURCE_NOT_FOUND" in text:
        return EngineError(f"Spark cannot read Delta tables: {first}", hint=_HOW_TO_GET_JARS)
    if window is not None and any(s in text for s in _GONE):
        return feed_unavailable(uri, window, e)
    return EngineError(f"Spark failed {what} {uri}: {first}")


#: A null incarnation, as a group key (never a real token: incarnations are hex).
_NO_LIFE = "\x00"


def _life() -> Any:
    from pyspark.sql import functions as F

    return F.coalesce(F.col("incarnation"), F.lit(_NO_LIFE))


def feed_plan(feed: Any, end: int) -> Any:
    """The feed plan of ``feed`` (``FEED_COLUMNS`` over ``(start, latest]``) as a one-row frame:
    rows and tail (change rows inside and after the window ``(start, end]``), docs (ids changed
    in the window) and pending (id, last_seq, dispatched_seq, incarnation of each document
    pending in the window and still pending now).

    The rule is ``cdf_local.documents``'s, in three aggregations. Per (id, life) and per scope
    (``w``: post-images up to ``end``; ``c``: every post-image): the life's newest document
    image (``_at``: its (commit, version), which picks the document's life; mark rows are no
    document image), the newest version's
    image by (version, commit) with the life's highest ``dispatched_seq``, and the life's
    deletes (version, commit) to test whether one ended that newest version. Per id, ``max_by``
    over ``_at`` keeps the life whose post-image is newest (a null key, no post-image in scope,
    is ignored). Last, one global aggregation.
    """
    from pyspark.sql import functions as F

    commit = F.col("_commit_version").cast("long")
    in_window = commit <= F.lit(end)
    post = F.col("_change_type").isin("insert", "update_postimage")
    gone = F.col("_change_type") == F.lit("delete")
    # a document image, not a mark row (which only counts toward the life's watermark: a late
    # mark of a deleted life must not pick that life)
    doc = F.col("version") > F.lit(MARK_VERSION)
    image = F.struct(
        F.col("last_seq").alias("last_seq"),
        F.col("version").alias("version"),
        commit.alias("commit"),
        F.col("incarnation").alias("incarnation"),
    )
    scopes = {"w": post & in_window, "c": post}
    per_life = feed.groupBy(F.col("id"), _life().alias("_life")).agg(
        F.sum(F.when(in_window, 1).otherwise(0)).alias("rows"),
        F.sum(F.when(in_window, 0).otherwise(1)).alias("tail"),
        F.collect_list(
            F.when(gone, F.struct(F.col("version").alias("version"), commit.alias("commit")))
        ).alias("_deletes"),
        *(
            agg
            for s, mine in scopes.items()
            for agg in (
                F.max(
                    F.when(mine & doc, F.struct(commit.alias("c"), F.col("version").alias("v")))
                ).alias(f"{s}_at"),
                F.max_by(image, F.when(mine & doc, F.struct(F.col("version"), commit))).alias(
                    f"{s}_new"
                ),
                F.max(F.when(mine, F.col("dispatched_seq"))).alias(f"{s}_ds"),
            )
        ),
    )

    def document(s: str) -> Any:
        """The life's document in scope ``s``: (last_seq, dispatched_seq, incarnation, pending)."""
        newest = F.col(f"{s}_new")
        ended = f"d.version >= {s}_new.version AND d.commit > {s}_new.commit"  # later commit
        if s == "w":
            ended += f" AND d.commit <= {int(end)}"
        deleted = F.expr(f"exists(_deletes, d -> {ended})")
        return F.struct(
            newest["last_seq"].alias("last_seq"),
            F.col(f"{s}_ds").cast("long").alias("dispatched_seq"),
            newest["incarnation"].alias("incarnation"),
            (~deleted & (newest["last_seq"] > F.col(f"{s}_ds"))).alias("pending"),
        )

    per_id = per_life.groupBy("id").agg(
        F.sum("rows").alias("rows"),
        F.sum("tail").alias("tail"),
        *(F.max_by(document(s), F.col(f"{s}_at")).alias(s) for s in scopes),
    )
    rescue = F.coalesce(F.col("w.pending") & F.col("c.pending"), F.lit(False))
    return per_id.agg(
        F.sum("rows").alias("rows"),
        F.sum("tail").alias("tail"),
        F.sum(F.when(F.col("rows") > 0, 1).otherwise(0)).alias("docs"),
        F.collect_list(
            F.when(
                rescue,
                F.struct(
                    F.col("id"),
                    F.col("c.last_seq"),
                    F.col("c.dispatched_seq"),
                    F.col("c.incarnation"),
                ),
            )
        ).alias("pending"),
    )


def sweep_frame(table: Any) -> Any:
    """``outbox.delta.versions.pending_sql`` run by Spark SQL over ``table`` (the rows at one
    version): each pending document as its highest version, with the highest ``dispatched_seq``
    over that version's life (id, last_seq, dispatched_seq, incarnation). The same text the local
    sweep runs (``outbox.delta.current``), so the two engines cannot drift; only the ids with
    some row pending are read twice."""
    sql = pending_sql(_SWEEP_COLUMNS, source="{rows}")  # the frame, as a temporary view
    return table.sparkSession.sql(sql, rows=table)


_SWEEP_COLUMNS = ["id", "last_seq", "dispatched_seq", "incarnation"]


class SparkEngine:
    """Plans with Spark DataFrames; only the pending (id, last_seq, dispatched_seq, incarnation)
    come back."""

    name = "spark"
    #: A pass plans on a cluster: a health check gives it longer (``outbox rescue --every``).
    on_a_cluster = True

    def __init__(
        self, spark: Any | None = None, *, storage_options: Mapping[str, str] | None = None
    ) -> None:
        self.options = hadoop_options(storage_options)
        self.spark = spark if spark is not None else get_spark()

    def _reader(self) -> Any:
        """A Delta reader carrying the table's credentials (as Hadoop ``fs.*`` options)."""
        return self.spark.read.format("delta").options(**self.options)

    def feed_frame(self, table_uri: str, window: FeedWindow) -> Any:
        return (
            self._reader()
            .option("readChangeFeed", "true")
            .option("startingVersion", window.start + 1)
            .option("endingVersion", window.latest)
            .load(table_uri)
            .select(*FEED_COLUMNS)
        )

    def plan_feed(self, table_uri: str, window: FeedWindow) -> Plan:
        """One Spark job, the local engine's plan (``cdf_local.plan_arrow``) as aggregations.

        Per (id, life) and then per id, for two scopes, the window (``w``: post-images up to
        ``window.end``) and the whole range (``c``: the current document), exactly the rule of
        ``cdf_local.documents``: the document's life is the one of its newest post-image (by
        commit, then version; ``max_by``), its newest version is that life's newest post-image
        (by version, then commit), its watermark the highest ``dispatched_seq`` over that life's
        post-images, and it is deleted when a ``delete`` image of that life has a version and a
        commit at or after the newest version's. An id is planned when it is pending in both
        scopes (the window's candidate, re-checked against its current document), with the
        current values. The final global aggregation counts rows and ids and gathers only the
        pending ids, so one row comes back to the driver; the feed itself is never collected.
        One job instead of several: each Spark job costs about a second in local mode, most of
        it scheduling.
        """
        t0 = time.perf_counter()
        try:
            result = feed_plan(self.feed_frame(table_uri, window), window.end).first()
        except Exception as e:
            raise _translate(table_uri, "reading the change feed of", e, window) from e
        t1 = time.perf_counter()
        rows = list(result["pending"] or []) if result is not None else []
        return Plan(
            "feed",
            self.name,
            int(result["rows"] or 0) if result is not None else 0,
            int(result["docs"] or 0) if result is not None else 0,
            pending_from_rows((r[0], r[1], r[2], r[3]) for r in rows),
            int(result["tail"] or 0) if result is not None else 0,
            {"read_s": t1 - t0, "plan_s": 0.0},
        )

    def plan_sweep(self, table_uri: str, version: int) -> Plan:
        """The rows at ``version`` through ``sweep_frame`` (``versions.pending_sql`` in Spark)."""
        t0 = time.perf_counter()
        try:
            table = self._reader().option("versionAsOf", version).load(table_uri)
            rows = sweep_frame(table).collect()
        except Exception as e:
            raise _translate(table_uri, "sweeping", e, None) from e
        found = ((r["id"], r["last_seq"], r["dispatched_seq"], r["incarnation"]) for r in rows)
        return sweep_plan(self.name, found, time.perf_counter() - t0)

    def close(self) -> None:
        """The session is shared per process; it is not stopped here."""
