"""Finding a damaged commit file in a table's Delta log, and saying what to do about it.

Once a checkpoint covers a commit, opening the table never reads that commit's file again, so a
damaged one goes unnoticed by everything that reads the table, while the rescuer, which reads the
change feed through those files, fails on it every pass. ``outbox status`` and ``outbox maintain``
check the commits a rescuer still reads; the rescuer's engines name the file when they fail on it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from outbox.core.errors import StoreError
from outbox.delta.log import LOG_DIR, LogFile, _filesystem, complete_checkpoints, list_log
from outbox.delta.table import local_log_dir

#: How many of the newest commit files ``find_damaged_commit`` reads at most (as many as
#: ``outbox status`` reads to time a rescuer's lag).
CHECK_LIMIT = 2000


@dataclass(frozen=True, slots=True)
class DamagedCommit:
    """A commit file that cannot be parsed, and why (``find_damaged_commit``)."""

    version: int
    path: str
    reason: str
    #: The newest whole checkpoint at or after ``version`` (None: none covers it).
    covered_by: int | None

    def error(self, uri: str) -> StoreError:
        """The one-line error, with what to do: a covered commit can go (the checkpoint holds the
        table), one after the newest checkpoint cannot (the table needs it)."""
        name = self.path.rsplit("/", 1)[-1]
        log_dir = local_log_dir(uri)
        where = str(log_dir / name) if log_dir is not None else f"{uri}/{LOG_DIR}/{name}"
        if self.covered_by is None:
            return StoreError(
                f"the Delta log of the table at {uri} is damaged: {name} {self.reason}",
                hint=f"restore {where} from a backup or a replica; Delta cannot rebuild its log "
                "from the data files",
            )
        return StoreError(
            f"the Delta log of the table at {uri} is damaged: {name} {self.reason}; the "
            f"checkpoint at version {self.covered_by} still holds the table, but the change feed "
            f"across version {self.version} cannot be read: a rescue pass that reads it fails",
            hint=f"restore {where} from a backup or a replica; without one, move it and the "
            f"commit files before it out of {LOG_DIR} (the checkpoint keeps the table whole), and "
            "the next rescue pass sweeps the table instead of reading the lost change feed",
        )


def find_damaged_commit(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    first: int | None = None,
    limit: int = CHECK_LIMIT,
    files: list[LogFile] | None = None,
) -> DamagedCommit | None:
    """The oldest commit file from version ``first`` on (of the newest ``limit``) that is not
    JSON lines, or None when each one parses.

    Why read the files ourselves: once a checkpoint covers a commit, opening the table never
    reads it, and deltalake's ``history()`` does not parse its ``add`` lines (1.6.6); the change
    feed reads every line, so a damaged ``add`` or ``cdc`` line failed every rescue pass while
    ``status`` and ``maintain`` saw a healthy table. ``first``: the oldest version a rescuer still
    reads (None: the whole log). ``files``: the log's listing, when the caller has it.
    """
    fs = _filesystem(uri, storage_options or {})
    files = list_log(uri, fs=fs) if files is None else files
    commits = sorted(
        (f for f in files if f.commit and (first is None or f.version >= first)),
        key=lambda f: f.version,
    )
    commits = commits[-limit:] if limit > 0 else []
    checkpoints = complete_checkpoints(files)
    for f in commits:
        try:
            with fs.open_input_stream(f.path) as stream:
                data = stream.read()
        except FileNotFoundError:
            continue  # trimmed meanwhile
        except OSError as e:
            raise StoreError(f"reading {f.path} of the table at {uri} failed: {e}") from e
        reason = _unparsable(data)
        if reason is not None:
            covered = [c for c in checkpoints if c >= f.version]
            return DamagedCommit(f.version, f.path, reason, max(covered) if covered else None)
    return None


def _unparsable(data: bytes) -> str | None:
    """Why ``data`` is no commit file (JSON objects, one a line), or None."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"is not UTF-8 text ({e.reason} at byte {e.start})"
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        return "is empty"
    for n, line in lines:
        try:
            parsed = json.loads(line)
        except ValueError as e:
            return f"is not valid JSON (line {n}: {getattr(e, 'msg', e)})"
        if not isinstance(parsed, dict):
            return f"is not valid JSON (line {n} is not an object)"
    return None


def damaged_log_error(
    uri: str, error: BaseException, storage_options: Mapping[str, str] | None = None
) -> StoreError | None:
    """Our error when ``error`` (deltalake's, reading history or the change feed) says a log file
    does not parse, naming the damaged commit and what to do; None for any other error.

    Why: such an error used to get the hint for a storage outage ("the next pass retries"), and
    the next pass failed the same way, forever."""
    text = str(error).lower()
    if "invalid json" not in text and "json error" not in text:
        return None
    shown = uri.removeprefix("file://").rstrip("/") if uri.startswith("file://") else uri
    try:
        damaged = find_damaged_commit(uri, storage_options)
    except StoreError:
        damaged = None
    if damaged is not None:
        return damaged.error(shown)
    first = str(error).strip().splitlines()[0]
    return StoreError(
        f"the Delta log of the table at {shown} cannot be read: {first}",
        hint=f"a file in {LOG_DIR} is damaged: restore it from a backup or a replica (`outbox "
        "status` names a damaged commit file)",
    )
