"""Where a pass's window ends: the newest version whose commit is at least ``delay`` old.

Why walk ``history()`` backwards from the latest version: the answer is always near the head (a
delay is at most an hour), so reading the newest commits costs O(commits in the last delay), never
O(history). ``load_cdf(ending_timestamp=...)`` and ``load_as_version(datetime)`` would walk the
log from version 0 (docs/delta.md), which grows without bound.

Commit timestamps are the writers' wall clocks (``commitInfo.timestamp``), so "now" comes from the
injected clock and is compared against them; tests set the clock relative to the real commit
timestamps instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from outbox.core.errors import RescuerError
from rescuer.planner import driver_errors

FIRST_BATCH = 32
#: How far back a lag is timed when the cache does not know the commit (``outbox status``).
HISTORY_LIMIT = 2000


@dataclass(frozen=True, slots=True)
class Commit:
    version: int
    timestamp: datetime


@dataclass(frozen=True, slots=True)
class WindowEnd:
    """The result of the walk.

    ``end`` is the newest version committed at or before ``cutoff``; None when no version after
    ``floor`` is that old (or the table has no such version at all). ``commits`` are the commits
    the walk read, newest first, down to ``end`` (or to ``floor + 1``): enough to tell the
    timestamp of the oldest version a pass leaves uncovered (the lag).
    """

    latest: int
    cutoff: datetime
    end: int | None
    commits: tuple[Commit, ...]


def _commits(entries: list[dict[str, Any]], latest: int) -> list[Commit]:
    out: list[Commit] = []
    for i, e in enumerate(entries):
        version = int(e.get("version", latest - i))
        ts = e.get("timestamp")
        if ts is None:
            raise RescuerError(
                f"commit {version} has no timestamp in its commitInfo; the rescuer cannot tell "
                "its age",
                hint="write the table with a Delta writer that records commitInfo (delta-rs and "
                "Spark both do)",
            )
        out.append(Commit(version, datetime.fromtimestamp(int(ts) / 1000, tz=UTC)))
    return out


def _latest(delta_table: Any) -> int:
    with driver_errors("reading the table version"):
        return int(delta_table.version())


def commit_times(delta_table: Any, newest_n: int, *, latest: int | None = None) -> list[Commit]:
    """The newest ``newest_n`` commits of the table, newest first, each with its commit time
    (``commitInfo.timestamp``, milliseconds since the epoch) as an aware UTC datetime.

    The one place that turns Delta commit timestamps into datetimes: the window walk, the pass
    report's lag and ``outbox status`` all use it. ``latest`` (the handle's version) saves a call
    when the caller already has it.
    """
    if newest_n <= 0:
        return []
    latest = _latest(delta_table) if latest is None else latest
    with driver_errors(
        f"reading the newest {newest_n} commits of the table history",
        uri=getattr(delta_table, "table_uri", None),
        storage_options=getattr(delta_table, "_storage_options", None),  # deltalake's own
    ):
        entries = list(delta_table.history(newest_n))
    return _commits(entries, latest)


def lag_seconds(
    delta_table: Any,
    covered: int | None,
    latest: int,
    now: datetime,
    *,
    known: Mapping[int, datetime] | None = None,
    limit: int = HISTORY_LIMIT,
) -> float:
    """Age of the oldest commit a checkpoint at ``covered`` does not cover yet (0 when it covers
    ``latest``). ``known`` commit times are used first; otherwise at most ``limit`` commits are
    read, and when the checkpoint is further behind than that the answer is a lower bound (the
    age of the oldest commit read)."""
    first = 0 if covered is None else covered + 1
    if first > latest:
        return 0.0
    ts = known.get(first) if known is not None else None
    if ts is None:
        commits = commit_times(delta_table, min(latest - first + 1, limit), latest=latest)
        ts = commits[-1].timestamp if commits else None
    return max(0.0, (now - ts).total_seconds()) if ts is not None else 0.0


def find_window_end(
    delta_table: Any,
    *,
    now: datetime,
    delay: float,
    floor: int | None = None,
    known: dict[int, datetime] | None = None,
) -> WindowEnd:
    """Walk the log backwards from the latest version until a commit is at least ``delay`` old.

    ``floor`` (the checkpoint) bounds the walk: versions at or below it are already covered, so
    when nothing above it is old enough the walk stops there and ``end`` is None.

    ``known`` is a version -> commit time cache the caller keeps across passes (``RescuePass``
    does): commits never change, so a pass reads only the versions committed since the last one
    (``history(latest - newest known)``), not the whole stretch younger than the delay again.
    It is updated in place; versions at or below ``floor`` are dropped from it (never needed
    again), and it is cleared when it holds versions past ``latest`` (the table was recreated).
    When the walk must go further back than the cache, it re-reads from the head (delta-rs can
    only read the newest N commits) with a batch that grows 4x per step, so a walk over n
    versions reads O(n) commits in total.
    """
    latest = _latest(delta_table)
    cutoff = now - timedelta(seconds=delay)
    stop = -1 if floor is None else floor
    cache: dict[int, datetime] = {} if known is None else known
    if cache and max(cache) > latest:
        cache.clear()
    for old in [v for v in cache if v <= stop]:
        del cache[old]
    batch = FIRST_BATCH
    v = latest
    while v > stop:
        ts = cache.get(v)
        if ts is None:
            newest = max(cache, default=None)
            if newest is not None and v > newest:
                wanted = latest - newest  # only what was committed since the last read
            else:
                wanted = min(latest - stop, max(latest - v + 1, batch))
                batch *= 4
            for c in commit_times(delta_table, wanted, latest=latest):
                cache[c.version] = c.timestamp
            ts = cache.get(v)
            if ts is None:  # the log no longer has this version: nothing older can be timed
                break
        if ts <= cutoff:
            return WindowEnd(latest, cutoff, v, _walked(cache, latest, v))
        v -= 1
    return WindowEnd(latest, cutoff, None, _walked(cache, latest, v + 1))


def _walked(cache: Mapping[int, datetime], latest: int, low: int) -> tuple[Commit, ...]:
    return tuple(Commit(x, cache[x]) for x in range(latest, low - 1, -1) if x in cache)
