"""What a replay sends: the range it reads, and the messages committed in it.

A message was *committed in* versions ``from..to`` when a document row of that range carries it
and its seq is above its document life's ``last_seq`` as of version ``from - 1`` (the table just
before the range). Why the second half: a row carries every message still pending when it was
saved, so a save in the range repeats the messages of earlier saves that had not left yet, and a
fold or a Spark MERGE in the range writes a post-image repeating a row it rewrote; those messages
were committed before the range. Each message counts once, at the first commit that wrote it
(``dispatcher.replay_handler.first_appearances``).

Only the retained history can be replayed: the log trim keeps ``log_retention`` of commits (longer
while a rescuer or a replay holds it), so a range starting before the oldest commit left is refused
with one line naming that version and the setting.

A time (ISO 8601, ``2026-11-29T10:00:00Z``; naive is UTC) is resolved once, here, to a version by
the commits' own timestamps (``commitInfo.timestamp``, as the rescuer reads them): ``--from TIME``
is the first commit at or after it, ``--to TIME`` the last commit at or before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dispatcher.replay_feed import first_appearances, read_feed
from outbox.core.durations import format_duration
from outbox.core.errors import OutboxError, ValidationError

#: Messages per chunk: one coalesced send's worth (``DEFAULT_MAX_BATCH_MESSAGES``), and a command
#: body of about 35 kB of ids.
CHUNK_MESSAGES = 1000
_NO_LIFE = "\x00"  # a null incarnation, as a join key


@dataclass(frozen=True, slots=True)
class Range:
    """Versions ``start..end`` (both included), as resolved from the command line."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """One command's worth: message ids of one bucket, first written in ``start..end``."""

    bucket: int
    start: int
    end: int
    message_ids: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """The messages a replay sends: one row each (``_commit_version, bucket, id, incarnation,
    seq, message_id, destination, type``), in sending order per bucket."""

    range: Range
    messages: pa.Table

    @property
    def documents(self) -> int:
        if self.messages.num_rows == 0:
            return 0
        return int(pc.count_distinct(self.messages["id"]).as_py())

    def counts(self) -> list[tuple[str, str, int]]:
        """(destination, type, messages), sorted: what the dry run shows."""
        if self.messages.num_rows == 0:
            return []
        grouped = self.messages.group_by(["destination", "type"]).aggregate(
            [("message_id", "count")]
        )
        rows = zip(
            grouped["destination"].to_pylist(),
            grouped["type"].to_pylist(),
            grouped["message_id_count"].to_pylist(),
            strict=True,
        )
        return sorted((str(d), str(t), int(n)) for d, t, n in rows)

    def chunks(self, size: int = CHUNK_MESSAGES) -> list[Chunk]:
        """The chunks, numbered round-robin over the buckets (a bucket's k-th chunk before any
        bucket's (k+1)-th), so workers on several threads find different sessions ready. The
        same plan always gives the same chunks: ``--resume`` re-plans and goes on from its
        cursor."""
        per_bucket: dict[int, list[Chunk]] = {}
        t = self.messages
        if t.num_rows == 0:
            return []
        order = [("bucket", "ascending"), ("_commit_version", "ascending")]
        order += [("id", "ascending"), ("seq", "ascending")]
        t = t.sort_by(order)
        buckets = t["bucket"].to_pylist()
        versions = t["_commit_version"].to_pylist()
        ids = t["message_id"].to_pylist()
        start = 0
        while start < len(ids):
            b = buckets[start]
            stop = start
            while stop < len(ids) and stop - start < size and buckets[stop] == b:
                stop += 1
            per_bucket.setdefault(b, []).append(
                Chunk(b, versions[start], versions[stop - 1], tuple(ids[start:stop]))
            )
            start = stop
        out: list[Chunk] = []
        depth = max(len(c) for c in per_bucket.values())
        for k in range(depth):
            out.extend(cs[k] for _, cs in sorted(per_bucket.items()) if k < len(cs))
        return out


# --- the range ---------------------------------------------------------------------------------


def commits(delta_table: Any) -> dict[int, datetime]:
    """version -> commit time of every commit the log still holds."""
    from rescuer.window import commit_times

    latest = int(delta_table.version())
    return {c.version: c.timestamp for c in commit_times(delta_table, latest + 1, latest=latest)}


def parse_point(text: str, option: str) -> int | datetime:
    """A table version (an integer) or a time (ISO 8601; naive is UTC)."""
    value = text.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(
            f"{option} {text!r} is neither a table version nor a time",
            hint="give a version (e.g. 42) or an ISO 8601 time (e.g. 2026-11-29T10:00:00Z)",
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def resolve_range(
    start: int | datetime,
    end: int | datetime,
    times: Mapping[int, datetime],
    *,
    latest: int,
    log_retention: float,
) -> Range:
    """Versions from the command line's points, checked against the retained history."""
    oldest = min(times, default=latest)
    first = start if isinstance(start, int) else _first_at_or_after(start, times, latest)
    last = end if isinstance(end, int) else _last_at_or_before(end, times, oldest, log_retention)
    if first < 0 or last < 0:
        raise ValidationError(
            f"table versions start at 0; got --from {first} --to {last}",
            hint="give versions between 0 and the table's newest",
        )
    if first > last:
        raise ValidationError(
            f"the replay range is reversed: --from is version {first}, after --to version {last}",
            hint="swap them: --from names the older end of the range",
        )
    if last > latest:
        raise ValidationError(
            f"--to version {last} is past the table's newest version {latest}",
            hint=f"replay up to version {latest} at most",
        )
    check_history(first, oldest, log_retention)
    return Range(first, last)


def check_history(first: int, oldest: int, log_retention: float) -> None:
    """A range is replayable when the table just before it (``first - 1``) and its commits are
    still in the log: from version 0 on an untrimmed log, else from ``oldest + 1``."""
    if first - 1 >= oldest or (first == 0 and oldest == 0):
        return
    raise ValidationError(
        f"version {first} is before the table's retained history, which begins at version "
        f"{oldest} (older commits were trimmed: the log keeps log_retention = "
        f"{format_duration(log_retention)}, longer only while a rescuer or a replay holds it)",
        hint=f"replay from version {oldest + 1} or later; to replay further back next time, "
        "raise log_retention",
    )


def _first_at_or_after(when: datetime, times: Mapping[int, datetime], latest: int) -> int:
    found = [v for v, t in times.items() if t >= when]
    if not found:
        raise ValidationError(
            f"--from {when.isoformat()}: no commit at or after that time (the newest, version "
            f"{latest}, is older)",
            hint="give an earlier time, or a version",
        )
    return min(found)


def _last_at_or_before(
    when: datetime, times: Mapping[int, datetime], oldest: int, log_retention: float
) -> int:
    found = [v for v, t in times.items() if t <= when]
    if not found:
        raise ValidationError(
            f"--to {when.isoformat()}: no retained commit at or before that time; the table's "
            f"retained history begins at version {oldest} (log_retention = "
            f"{format_duration(log_retention)})",
            hint="give a later time, or a version",
        )
    return max(found)


# --- the messages ------------------------------------------------------------------------------


def plan_replay(
    delta_table: Any,
    before_table: Any | None,
    rng: Range,
    *,
    predicate: str | None = None,
    destination: str | None = None,
) -> Plan:
    """The messages committed in ``rng`` (of the documents ``predicate`` selects, to
    ``destination`` only when given). ``before_table``: the table as of ``rng.start - 1`` (None
    when the range starts at version 0)."""
    from deltalake.exceptions import DeltaError

    try:
        feed = read_feed(delta_table, rng.start, rng.end, predicate=predicate, full=False)
    except (DeltaError, OSError, pa.ArrowException) as e:
        raise _feed_error(e, predicate) from e
    feed = first_appearances(feed)
    before = before_seqs(before_table) if before_table is not None else None
    feed = committed_in_range(feed, before)
    if destination is not None:
        feed = feed.filter(pc.equal(feed["destination"], destination))
    return Plan(rng, feed)


def _feed_error(e: BaseException, predicate: str | None) -> OutboxError:
    from rescuer.cdf_local import history_gone

    text = (str(e).splitlines() or [""])[0]
    if history_gone(e):
        return ValidationError(
            f"the change data feed of the range is gone ({text})",
            hint="replay a range inside the retained history (`outbox status` shows the oldest "
            "version the log holds)",
        )
    if predicate is not None:
        return ValidationError(
            f"--where {predicate!r} cannot be applied to the table's rows: {text}",
            hint="write a SQL predicate over the document columns, e.g. \"type = 'Package'\"",
        )
    return OutboxError(f"reading the change data feed failed: {text}")


def before_seqs(before_table: Any) -> pa.Table:
    """Per document life, its ``last_seq`` in the table as of the version before the range:
    ``id, _life, before_seq`` (a null incarnation is the life ``_NO_LIFE``)."""
    from deltalake import QueryBuilder

    from outbox.delta.reads import plain_strings

    sql = (
        "SELECT id, incarnation, max(last_seq) AS before_seq FROM t WHERE version > 0 "
        "GROUP BY id, incarnation"
    )
    reader = QueryBuilder().register("t", before_table).execute(sql)
    t = plain_strings(pa.RecordBatchReader.from_stream(reader).read_all())
    return pa.table(
        {
            "id": pc.cast(t["id"], pa.string()),
            "_life": pc.fill_null(pc.cast(t["incarnation"], pa.string()), _NO_LIFE),
            "before_seq": pc.cast(t["before_seq"], pa.int64()),
        }
    )


def committed_in_range(messages: pa.Table, before: pa.Table | None) -> pa.Table:
    """The messages whose seq is above their life's ``last_seq`` before the range (a life the
    table did not hold then starts at 0). Keeps the messages' order."""
    if before is None or messages.num_rows == 0:
        return messages
    t = messages.append_column("_row", pa.array(range(messages.num_rows), pa.int64()))
    t = t.append_column("_life", pc.fill_null(t["incarnation"], _NO_LIFE))
    joined = t.join(before, keys=["id", "_life"], join_type="left outer")
    keep = pc.greater(joined["seq"], pc.fill_null(joined["before_seq"], 0))
    rows = pc.sort_indices(joined.filter(keep)["_row"])
    kept = joined.filter(keep).take(rows)
    return kept.select(messages.column_names)
