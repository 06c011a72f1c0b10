"""Every benchmark still runs, and no quick run touches a committed results file.

Each ``benchmarks/*.py`` with a ``main`` (found by reading the folder, so a new benchmark cannot
be left out: it fails here until ``SMOKES`` says how to run it) runs at its ``--smoke`` size, the
full run's every step on a few documents, with no ``--out``: by the rule in benchmarks/common.py
its results file must then land in a fresh temporary folder, and ``TMPDIR`` points that (and the
benchmark's scratch folders) into the test's ``tmp_path``. Each test asserts that the run
succeeded, that it wrote exactly its ``<name>.smoke.json`` there with the top-level keys of the
full run's file that matter (what the docs' tables are rendered from), and that
``benchmarks/results/`` is as it was: ``git status --porcelain`` and every file's size and
modification time. ``--out DIR``, the other way to choose the folder, is checked on the shared
helper and in every benchmark's ``--help``.

The servers come from the suite: PostgreSQL from ``pg_url``, the broker from ``mqtt_url``, Kafka
from ``kafka``, Azurite and moto's S3 server from ``azurite_url`` and ``s3_url``. The Spark
benchmarks run in this process on the ``spark_session`` fixture, so they reuse the Spark tests'
JVM (tests/conftest.py puts them on that worker) and its Kafka broker instead of starting their
own.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks import common

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = common.RESULTS

#: Modules of benchmarks/ with a ``main`` that measure nothing, and why they are not run here.
NOT_BENCHMARKS = {
    "report": "renders the docs' tables from the results files; tests/test_docs_numbers.py "
    "runs it against every document",
}


@dataclass(frozen=True)
class Smoke:
    keys: frozenset[str]  # top-level keys the results file must have (as the full run's file)
    args: tuple[str, ...] = ()
    #: "postgres", "mqtt", "kafka", "azurite" or "objectstore" (Azurite and S3): the suite's
    #: servers are passed in (--pg-url, --broker, --bootstrap, --azurite, --s3)
    needs: str = ""
    #: more to check on the smoke run's results (a report block renders from them, say)
    check: Callable[[dict[str, Any]], None] | None = None


def _console_report_renders(data: dict[str, Any]) -> None:
    """benchmarks/report_console.py renders the console's block from what the benchmark writes
    (the committed console.json comes from a full run), a row per page."""
    from benchmarks import report_console

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report_console, "load", lambda name: data)
        block = report_console.console()
    assert "| page | p50 | p95 | max | floor p50 | within 200 ms |" in block
    for page in data["pages"]:
        assert f"`{page['request']}`" in block
    assert "console sample" in block


def _kafka_dead_letters_report_renders(data: dict[str, Any]) -> None:
    """docs/console.md's Kafka block renders from what the benchmark writes, a row per page."""
    from benchmarks import report_console

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report_console, "load", lambda name: data)
        block = report_console.kafka_dead_letters()
    assert len([p for p in data["pages"] if p["request"].split("?")[0] in block]) == 4


def _goals_report_renders_with(name: str) -> Callable[[dict[str, Any]], None]:
    """The README's goals block renders with this run's row (the other rows from the committed
    files)."""

    def check(data: dict[str, Any]) -> None:
        from benchmarks import report_goals

        real = report_goals.load
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(report_goals, "load", lambda n: data if n == name else real(n))
            block = report_goals.goals()
        assert len(block.splitlines()) == 2 + len(report_goals.GOALS)
        assert f"`{name}.json`" in block

    return check


def _pipeline_report_renders(data: dict[str, Any]) -> None:
    """docs/performance.md's P2 row renders from what the benchmark writes."""
    from benchmarks import report_pipeline
    from benchmarks.report_common import n

    row = report_pipeline.readme_row(data)
    assert row[2] == "`pipeline.json`"
    assert f"**{n(data['over_floor'], 2)}" in row[1]


def _table_state_report_renders(data: dict[str, Any]) -> None:
    """benchmarks/report_table_state.py renders docs/delta.md's blocks and docs/performance.md's
    row from what the benchmark writes (the committed table_state.json comes from a full run)."""
    from benchmarks import report_table_state as r

    assert "| **a transaction per document, born expired (chosen)** |" in r.candidates(data)
    assert "transactions born expired" in r.day(data)
    assert "| local, from 200 documents" in r.runs(data)
    assert "| local |" in r.disk(data)
    assert "checkpoint" in r.readme_row(data)[1]


def _trace_history_report_renders(data: dict[str, Any]) -> None:
    from benchmarks import report_trace

    assert "`trace_history.json`" in report_trace.trace_history(data)


def _small_writers_report_renders(data: dict[str, Any]) -> None:
    """The performance row and the block render from a smoke run's file."""
    from benchmarks import report_small_writers

    assert "`small_writers.json`" in report_small_writers.readme_row(data)[2]
    assert "| floor |" in report_small_writers.small_writers(data)


def _dispatcher_cost_report_renders(data: dict[str, Any]) -> None:
    """benchmarks/report_dispatch_cost.py renders its row from what the benchmark writes (no
    committed dispatcher_cost.json yet: a full run on a quiet machine makes it)."""
    from benchmarks import report_dispatch_cost

    block = report_dispatch_cost.dispatcher_cost(data)
    assert "`dispatcher_cost.json`" in block
    assert f"{data['dispatch_us']['mean']:,.2f} µs" in block


def _consumer_report_renders(data: dict[str, Any]) -> None:
    """benchmarks/report_queue.py renders the consumer's block from what the benchmark writes,
    a column per database, and the run drained every message at each concurrency."""
    from benchmarks import report_queue

    block = report_queue.consumer(data)
    assert "| 300 messages | SQLite | PostgreSQL |" in block
    assert "| Consumer, 16 handlers |" in block
    assert "floor: take 100 + delete 100 per transaction" in block


def _spark_passes_ran(data: dict[str, Any]) -> None:
    """The rescuer's Spark passes, the feed and the sweep, ran at its one size."""
    (size,) = data["sizes"]
    assert {"spark_pass_s", "spark_sweep_pass_s"} <= size.keys(), size


def _keys(*names: str) -> frozenset[str]:
    return frozenset(names)


_RESCUER = _keys(
    "sizes",
    "planner",
    "changed_docs",
    "feed_pass_growth_200_to_1k",
    "sweep_over_feed_at_1k",
    "many_commits",
    "versions_per_second",
)

#: How each benchmark's smoke run is made, run as ``python -m benchmarks.NAME --smoke ARGS``.
SMOKES: dict[str, Smoke] = {
    "checker_soak": Smoke(
        _keys("kind", "seeds_run", "ok_seeds", "failed_seeds", "total", "seeds", "wall_s")
    ),
    "console": Smoke(
        _keys("sizes", "requests", "pages", "all_within_200ms", "sample", "build_s", "wall_s"),
        check=_console_report_renders,
    ),
    "consumer": Smoke(
        _keys("sqlite", "postgresql", "goal", "load_average_before", "load_average_after"),
        needs="postgres",
        check=_consumer_report_renders,
    ),
    "current_documents": Smoke(
        _keys("sizes", "ids_100", "whole_table", "ratio_ids", "ratio_whole_table", "goal")
    ),
    "dispatcher_cost": Smoke(
        _keys(
            "dispatch_us", "floor_us", "own_us", "dispatch_over_floor", "cpu_us", "gc", "meets_goal"
        ),
        check=_dispatcher_cost_report_renders,
    ),
    "doc_table": Smoke(
        _keys("sizes", "changed_per_commit", "buckets", "writers", "txn_state", "disk")
    ),
    "fold_writers": Smoke(
        _keys("over_alone", "longest_wait_s", "starved", "meets_goal", "pairs"),
        check=_goals_report_renders_with("fold_writers"),
    ),
    "dispatch": Smoke(
        _keys(
            "cases",
            "window_sweep",
            "messages_per_second",
            "p99_ms",
            "speedup_over_inline_watermark",
            "meets_goal",
            "headline",
        )
    ),
    "gateway": Smoke(
        _keys(
            "queue",
            "queue_batched",
            "all_acking",
            "gateway_over_queue",
            "acking_alone",
            "with_silent_and_offline",
            "silent_and_offline_slowdown",
            "gateway_memory_mb",
        ),
        needs="mqtt",
    ),
    "kafka": Smoke(
        _keys(
            "outbox",
            "raw",
            "transport_alone",
            "ratio",
            "transport_alone_ratio",
            "per_1000_messages",
            "memory_transport",
        ),
        needs="kafka",
    ),
    "kafka_dead_letters": Smoke(
        _keys("records", "partitions", "page_size", "pages", "whole_topic_read", "within_200ms"),
        needs="kafka",
        check=_kafka_dead_letters_report_renders,
    ),
    "dispatch_scale": Smoke(
        _keys("small", "large", "cost_ratio", "meets_goal"),
        check=_goals_report_renders_with("dispatch_scale"),
    ),
    "pipeline": Smoke(
        _keys("documents_per_unit_of_work", "outbox", "floor", "over_floor", "meets_goal"),
        check=_pipeline_report_renders,
    ),
    "replay": Smoke(
        _keys("messages", "dispatcher", "replay", "replay_over_dispatcher", "meets_goal")
    ),
    "rescuer": Smoke(_RESCUER, args=("--no-spark",)),  # its Spark passes: SPARK_SMOKES
    # HEAD against itself: the trees come from `git archive`, so the clone's commits only
    "object_store": Smoke(_keys("stores", "sizes", "dispatch_vs_local"), needs="objectstore"),
    "revisions": Smoke(_keys("before", "after", "pairs", "noise", "cases", "no_slower")),
    "sessions": Smoke(
        _keys("sqlite", "postgresql", "sessions", "tasks", "load_average_before"),
        needs="postgres",
    ),
    "small_writers": Smoke(
        _keys("cases", "goal", "units_per_second", "meets_goal", "headline_threads", "rounds"),
        check=_small_writers_report_renders,
    ),
    "sql_queue": Smoke(
        _keys("sqlite", "postgresql", "load_average_before", "load_average_after"),
        needs="postgres",
    ),
    "table_state": Smoke(
        _keys("kind", "log_retention_s", "candidates", "day", "local", "azure"),
        needs="azurite",
        check=_table_state_report_renders,
    ),
    "trace_history": Smoke(
        _keys("trace", "floor", "history_versions", "commits_shown", "within_200ms", "goal_ms"),
        check=_trace_history_report_renders,
    ),
    "telemetry": Smoke(
        _keys("cases", "slowdown_percent", "goal_slowdown_percent", "headline", "wall_s")
    ),
    "write_path": Smoke(
        _keys(
            "ratio",
            "save_vs_raw_ratio",
            "batches",
            "group_commit",
            "growth_without_upkeep",
            "growth_with_compaction_every_100",
            "buckets",
            "long_run_compaction_only",
            "long_run_with_upkeep",
        )
    ),
}

#: The runs that need Spark: ``main(["--smoke", *ARGS])`` in this process, on its SparkSession.
SPARK_SMOKES: dict[str, Smoke] = {
    "spark_write": Smoke(
        _keys(
            "apply_over_raw_merge",
            "messages_per_second",
            "ratio",
            "dispatch",
            "python_path_same_batch",
            "dispatch_over_python_path",
        )
    ),
    # the Spark passes alone: SMOKES' run (--no-spark, a process on another worker) makes the
    # rest, so the Spark tests' worker does not repeat it
    "rescuer": Smoke(
        _keys("sizes", "changed_docs", "sweep_over_feed_at_200", "spark_over_local_at_200"),
        args=("--spark-only",),
        check=_spark_passes_ran,
    ),
    # on the suite's broker: the Spark tests' worker starts one anyway (tests/spark's executors
    # send to it), and a second broker's start cost this smoke run most of its 100 s in CI
    "spark_kafka": Smoke(
        _keys("runs", "python_path", "over_before", "over_python_path"), needs="kafka"
    ),
}


def discovered() -> list[str]:
    """The modules of benchmarks/ that define a top-level ``main``."""
    found = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            found.append(path.stem)
    return found


def _results_state() -> tuple[str, dict[str, tuple[int, int]]]:
    """``git status`` of benchmarks/results/ and each file's (mtime, size) there."""
    status = ""
    if shutil.which("git") and (ROOT / ".git").exists():
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all", "--", "benchmarks/results"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    files = {
        str(p.relative_to(RESULTS)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(RESULTS.rglob("*"))
        if p.is_file()
    }
    return status, files


def _unchanged(before: tuple[str, dict[str, tuple[int, int]]]) -> None:
    status, files = _results_state()
    assert status == before[0], f"the run changed benchmarks/results/:\n{status}"
    changed = sorted(k for k in files.keys() | before[1].keys() if files.get(k) != before[1].get(k))
    assert not changed, f"the run wrote into benchmarks/results/: {changed}"


def _check_results(name: str, smoke: Smoke, tmp: Path) -> dict[str, Any]:
    written = sorted(tmp.glob("outbox-bench-results-*/*.json"))
    assert [p.name for p in written] == [f"{name}.smoke.json"], written
    data: dict[str, Any] = json.loads(written[0].read_text())
    assert data.get("smoke") is True
    missing = sorted(smoke.keys - data.keys())
    assert not missing, f"{written[0].name} lacks {missing}"
    if smoke.check is not None:
        smoke.check(data)
    return data


def _took(name: str, started: float) -> None:
    print(f"smoke {name}: {time.monotonic() - started:.1f} s")  # shown with -s or on failure


def test_every_benchmark_has_a_smoke_run() -> None:
    benchmarks = set(discovered()) - set(NOT_BENCHMARKS)
    assert benchmarks == set(SMOKES) | set(SPARK_SMOKES), (
        "every benchmarks/*.py with a main needs an entry in SMOKES or SPARK_SMOKES "
        "(or NOT_BENCHMARKS, with the reason)"
    )
    assert set(NOT_BENCHMARKS) <= set(discovered())  # no stale entry


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.postgres)
        if n in SMOKES and SMOKES[n].needs == "postgres"
        else n
        for n in discovered()
        if n not in NOT_BENCHMARKS and (n in SMOKES or n not in SPARK_SMOKES)
    ],
)
def test_benchmark_runs_at_its_smoke_size(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    smoke = SMOKES.get(name)
    if smoke is None:
        pytest.fail(f"benchmarks/{name}.py has a main but no entry in SMOKES")
    args = ["--smoke", *smoke.args]
    if smoke.needs == "postgres":
        args += ["--pg-url", str(request.getfixturevalue("pg_url"))]
    elif smoke.needs == "mqtt":
        args += ["--broker", str(request.getfixturevalue("mqtt_url"))]
    elif smoke.needs == "kafka":
        args += ["--bootstrap", str(request.getfixturevalue("kafka").bootstrap)]
    if smoke.needs in ("azurite", "objectstore"):
        args += ["--azurite", str(request.getfixturevalue("azurite_url"))]
    if smoke.needs == "objectstore":
        args += ["--s3", str(request.getfixturevalue("s3_url"))]
    before = _results_state()
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        check=False,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    _took(name, started)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    _unchanged(before)
    _check_results(name, smoke, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPARK_SMOKES))
def test_spark_benchmark_runs_at_its_smoke_size(
    name: str,
    spark_session: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    smoke = SPARK_SMOKES[name]
    args = ["--smoke", *smoke.args]
    if smoke.needs == "kafka":
        args += ["--bootstrap", str(request.getfixturevalue("kafka").bootstrap)]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = _results_state()
    started = time.monotonic()
    importlib.import_module(f"benchmarks.{name}").main(args)
    _took(name, started)
    _unchanged(before)
    _check_results(name, smoke, tmp_path)


@pytest.mark.parametrize("name", sorted(set(discovered()) - set(NOT_BENCHMARKS)))
def test_every_benchmark_offers_out_and_smoke(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(f"benchmarks.{name}").main(["--help"])
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    assert "--out DIR" in usage
    assert "--smoke" in usage


def test_a_quick_run_never_writes_into_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule every benchmark's output goes through (benchmarks/common.py)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert common.results_dir(None, quick=False) == RESULTS  # a full run: the committed files
    fresh = common.results_dir(None, quick=True)  # a fresh temporary folder
    assert fresh.parent == tmp_path
    assert fresh.is_dir()
    assert not any(fresh.iterdir())
    assert common.results_dir(tmp_path, quick=True) == tmp_path  # --out DIR
    for inside in (RESULTS, RESULTS / "sub", BENCHMARKS / "results" / ".." / "results"):
        with pytest.raises(SystemExit, match="never writes into"):
            common.results_dir(inside, quick=True)
    args = argparse.Namespace(out=tmp_path, smoke=True, quick=False)
    path = common.save(args, "example", {"figure": 1.0})
    assert path == tmp_path / "example.smoke.json"
    assert json.loads(path.read_text())["smoke"] is True
