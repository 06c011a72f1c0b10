"""Where a pass's window ends: the newest version whose commit is at least ``delay`` old.

Why walk ``history()`` backwards from the latest version: the answer is always near the head (a
delay is at most an hour), so reading the newest commits costs O(commits in the last delay), never
O(history). ``load_cdf(ending_timestamp=...)`` and ``load_as_version(datetime)`` would walk the
log from version 0 (see DELTA_NOTES.md), which grows without bound.

Commit timestamps are the writers' wall clocks (``commitInfo.timestamp``), so "now" comes from the
injected clock and is compared against them; tests set the clock relative to the real commit
timestamps instead of sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from outbox.errors import RescuerError
from rescuer.planner import driver_errors

FIRST_BATCH = 32
MAX_BATCH = 4096


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

    def timestamp_of(self, version: int) -> datetime | None:
        for c in self.commits:
            if c.version == version:
                return c.timestamp
        return None


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


def find_window_end(
    delta_table: Any, *, now: datetime, delay: float, floor: int | None = None
) -> WindowEnd:
    """Walk the log backwards from the latest version until a commit is at least ``delay`` old.

    ``floor`` (the checkpoint) bounds the walk: versions at or below it are already covered, so
    when nothing above it is old enough the walk stops there and ``end`` is None.
    """
    with driver_errors("reading the table version"):
        latest = int(delta_table.version())
    cutoff = now - timedelta(seconds=delay)
    stop = -1 if floor is None else floor
    limit = FIRST_BATCH
    while True:
        wanted = min(limit, latest - stop)
        if wanted <= 0:
            return WindowEnd(latest, cutoff, None, ())
        with driver_errors(f"reading the newest {wanted} commits of the table history"):
            entries = list(delta_table.history(wanted))
        commits = _commits(entries, latest)
        for c in commits:
            if c.version <= stop:
                break
            if c.timestamp <= cutoff:
                walked = tuple(x for x in commits if x.version >= c.version)
                return WindowEnd(latest, cutoff, c.version, walked)
        oldest = commits[-1].version if commits else stop
        if oldest <= stop + 1 or len(commits) < wanted:
            return WindowEnd(latest, cutoff, None, tuple(x for x in commits if x.version > stop))
        limit = min(limit * 4, MAX_BATCH) if limit < MAX_BATCH else limit + MAX_BATCH
