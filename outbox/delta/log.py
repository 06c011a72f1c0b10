"""Trimming the Delta log, because every commit file left behind slows every later commit.

Measured (docs/delta.md): deltalake 1.6.6 lists the whole ``_delta_log`` directory each time it
builds or advances a snapshot, and it advances one after every commit. With 4,100 files in the
log a one-row MERGE took 111 ms; the same table with the log trimmed to its last checkpoint took
37 ms. Delta's own cleanup (``delta.logRetentionDuration``, 30 days by default) keeps far more
than an outbox table can afford, and knows nothing of the rescuer, which reads the change feed
through these very files.

The rule: pick C, the newest checkpoint that is
  (a) not after the oldest version a rescuer still has to read,
  (b) not after the newest commit older than ``retention``, and
  (c) older than the newest checkpoint (a reader that has just chosen the previous checkpoint
      still finds it),
then delete the log files of versions before C. C's checkpoint and every commit from C on stay,
so the table, the change feed from C and time travel back to C are intact.

The change-data files those commits wrote (``_change_data/``) go with them: nothing can read them
once their commits are gone, and deltalake's vacuum never deletes them (they are never
tombstoned), so without this they would pile up forever.

It goes through deltalake's own object-store layer (``DeltaStorageHandler``), so the same code
trims a local table and one on ADLS or S3 with the table's storage options.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote

from outbox.core.errors import StoreError

log = logging.getLogger("outbox.maintain")

LOG_DIR = "_delta_log"
#: ``<20-digit version>.json``, ``.checkpoint.parquet``, multi-part checkpoints, ``.crc``,
#: ``<v>.<v>.compacted.json``: every log file starts with the version it belongs to.
_VERSIONED = re.compile(r"^(\d{20})\.")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d+)\.(\d+))?\.parquet$")
_COMMIT = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True, slots=True)
class LogFile:
    path: str
    version: int
    mtime: datetime | None
    commit: bool
    checkpoint: bool
    #: A multi-part checkpoint's (part, parts); None for a single-file checkpoint.
    part: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class TrimPlan:
    """What a trim would do. ``keep_from`` is C (None: nothing may go); ``held_by`` says which
    of the three rules chose it: ``rescuer``, ``retention`` or ``checkpoints``."""

    keep_from: int | None
    held_by: str
    doomed: tuple[LogFile, ...]
    files: int


@dataclass(frozen=True, slots=True)
class TrimReport:
    keep_from: int | None
    held_by: str
    deleted: int
    remaining: int
    dry_run: bool
    change_files_deleted: int = 0
    data_files_deleted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "keep_from_version": self.keep_from,
            "held_by": self.held_by,
            "deleted_files": self.deleted,
            "change_data_files_deleted": self.change_files_deleted,
            "data_files_deleted": self.data_files_deleted,
            "log_files": self.remaining,
            "dry_run": self.dry_run,
        }


def _filesystem(uri: str, storage_options: Mapping[str, str]) -> Any:
    import pyarrow.fs as pfs
    from deltalake.fs import DeltaStorageHandler

    return pfs.PyFileSystem(DeltaStorageHandler(uri, dict(storage_options) or None))


def list_log(
    uri: str, storage_options: Mapping[str, str] | None = None, fs: Any = None
) -> list[LogFile]:
    """Every versioned file in the table's ``_delta_log`` (unknown names are left alone)."""
    import pyarrow.fs as pfs

    fs = fs or _filesystem(uri, storage_options or {})
    try:
        infos = fs.get_file_info(pfs.FileSelector(LOG_DIR, allow_not_found=True))
    except OSError as e:
        raise StoreError(f"listing the Delta log of {uri} failed: {e}") from e
    out: list[LogFile] = []
    for info in infos:
        if info.type != pfs.FileType.File:
            continue
        name = info.path.rsplit("/", 1)[-1]
        m = _VERSIONED.match(name)
        if m is None:
            continue
        cp = _CHECKPOINT.match(name)
        out.append(
            LogFile(
                path=info.path,
                version=int(m.group(1)),
                mtime=info.mtime,
                commit=bool(_COMMIT.match(name)),
                checkpoint=cp is not None,
                part=(int(cp.group(2)), int(cp.group(3))) if cp and cp.group(2) else None,
            )
        )
    return out


def complete_checkpoints(files: list[LogFile]) -> list[int]:
    """Versions with a whole checkpoint: a single file, or every part of a multi-part one (a
    writer that died half-way leaves parts that no reader can use)."""
    single = {f.version for f in files if f.checkpoint and f.part is None}
    parts: dict[tuple[int, int], set[int]] = {}
    for f in files:
        if f.checkpoint and f.part is not None:
            parts.setdefault((f.version, f.part[1]), set()).add(f.part[0])
    multi = {v for (v, n), seen in parts.items() if seen == set(range(1, n + 1))}
    return sorted(single | multi)


def plan_trim(files: list[LogFile], *, cutoff: datetime, needed: int | None) -> TrimPlan:
    """Choose C (see the module docstring) from the files of the log.

    ``cutoff``: commits at or before it are older than the retention. Their age is the commit
    file's modification time, as Delta's own log cleanup uses (writing the file is the commit).
    ``needed``: the oldest version a rescuer still has to read (None: no rescuer checkpoint).
    """
    checkpoints = complete_checkpoints(files)
    if len(checkpoints) < 2:
        return TrimPlan(None, "checkpoints", (), len(files))
    bound, held_by = checkpoints[-2], "checkpoints"
    old_enough = (f.version for f in files if f.commit and f.mtime and f.mtime <= cutoff)
    retention_bound = max(old_enough, default=-1)
    if retention_bound < bound:
        bound, held_by = retention_bound, "retention"
    if needed is not None and needed < bound:
        bound, held_by = needed, "rescuer"
    eligible = [c for c in checkpoints if c <= bound]
    if not eligible:
        return TrimPlan(None, held_by, (), len(files))
    keep_from = eligible[-1]
    doomed = tuple(f for f in files if f.version < keep_from)
    return TrimPlan(keep_from, held_by, doomed, len(files))


def change_files(
    uri: str,
    commit: LogFile,
    fs: Any = None,
    storage_options: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``_change_data`` files a commit wrote (its ``cdc`` actions), relative to the table."""
    fs = fs or _filesystem(uri, storage_options or {})
    with fs.open_input_stream(commit.path) as stream:
        text = stream.read().decode("utf-8")
    out: list[str] = []
    for line in text.splitlines():
        if '"cdc"' not in line:
            continue
        parsed = json.loads(line)
        action = parsed.get("cdc") if isinstance(parsed, dict) else None
        path = unquote(str(action.get("path", ""))) if isinstance(action, dict) else ""
        if path and "://" not in path and not path.startswith("/") and ".." not in path:
            out.append(path)  # never anything outside the table
    return out


def commit_actions(
    uri: str,
    version: int,
    fs: Any = None,
    storage_options: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The actions of one commit file, each a one-key dict as the log stores it."""
    fs = fs or _filesystem(uri, storage_options or {})
    path = f"{LOG_DIR}/{version:020d}.json"
    try:
        with fs.open_input_stream(path) as stream:
            text = stream.read().decode("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise StoreError(f"reading commit {version} of {uri} failed: {e}") from e


def commit_info(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """A commit's ``commitInfo`` (empty when it wrote none): who wrote it and what it read."""
    return next(
        (dict(a["commitInfo"]) for a in actions if isinstance(a.get("commitInfo"), dict)), {}
    )


def removed_by(actions: list[dict[str, Any]]) -> tuple[set[str], bool]:
    """The paths a commit removed, and whether every removal was data-neutral (a compaction)."""
    paths: set[str] = set()
    neutral = True
    for a in actions:
        r = a.get("remove")
        if isinstance(r, dict):
            paths.add(unquote(str(r.get("path", ""))))
            neutral = neutral and r.get("dataChange") is False
    return paths, neutral


def trim_log(
    uri: str,
    *,
    now: datetime,
    retention: timedelta,
    needed: int | None,
    storage_options: Mapping[str, str] | None = None,
    dry_run: bool = False,
    live_files: set[str] | None = None,
) -> TrimReport:
    """Delete the log files of versions before C, each commit's change-data files just before
    the commit itself, oldest first, and the old checkpoints last. A trim cut short (a crash, a
    failed delete) so never leaves a commit without the checkpoint before it, nor a change-data
    file that no commit names any more.

    With ``live_files`` (the data files of the current snapshot, relative paths), each trimmed
    commit's *removed* data files go too, unless still live: the vacuum of the versions layout,
    where every save's small file is later folded or compacted away. Safe for the same reasons
    as the trim: such a file belongs to no snapshot from C on, and the rescuer has read past
    the commit (``needed``); so removed data is kept ``log_retention`` (or as long as the
    rescuer lags), not the hours deltalake's vacuum counts in."""
    fs = _filesystem(uri, storage_options or {})
    plan = plan_trim(list_log(uri, fs=fs), cutoff=now - retention, needed=needed)
    doomed = sorted(plan.doomed, key=lambda f: (f.checkpoint, f.version))
    if dry_run or not doomed:
        return TrimReport(plan.keep_from, plan.held_by, len(doomed), plan.files, dry_run)

    def delete(path: str) -> None:
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass  # another trimmer got there first
        except OSError as e:
            raise StoreError(
                f"trimming the Delta log of {uri} failed at {path}: {e}",
                hint="the table is intact (only files older than a kept checkpoint are "
                "deleted); fix access to the log and run `outbox maintain` again",
            ) from e

    deleted = changes = data = 0
    for f in doomed:
        if f.commit:
            try:
                paths = change_files(uri, f, fs)
                gone = [] if live_files is None else _removed_data(uri, f, fs, live_files)
            except FileNotFoundError:
                paths, gone = [], []
            except (OSError, ValueError) as e:
                raise StoreError(
                    f"trimming the Delta log of {uri} failed reading {f.path}: {e}",
                    hint="the table is intact; fix access to the log and run `outbox maintain` "
                    "again",
                ) from e
            for path in paths:
                delete(path)
                changes += 1
            for path in gone:
                delete(path)
                data += 1
        delete(f.path)
        deleted += 1
    log.info(
        "trimmed %d log files and %d change-data files before version %d (held by %s)",
        deleted,
        changes,
        plan.keep_from,
        plan.held_by,
    )
    return TrimReport(
        plan.keep_from, plan.held_by, deleted, plan.files - deleted, dry_run, changes, data
    )


def _removed_data(uri: str, commit: LogFile, fs: Any, live: set[str]) -> list[str]:
    """The data files ``commit`` removed that the current snapshot no longer holds (never a path
    outside the table)."""
    with fs.open_input_stream(commit.path) as stream:
        actions = [json.loads(line) for line in stream.read().decode("utf-8").splitlines() if line]
    removed, _ = removed_by(actions)
    return sorted(
        p
        for p in removed - live
        if p and "://" not in p and not p.startswith("/") and ".." not in p
    )


def oldest_retained(uri: str, fs: Any) -> int | None:
    """``oldest_commit(list_log(...))``, by names only on a local table: the listing of a long
    log costs more than everything else a trace does (84 against 7 ms at 10,000 commits)."""
    from outbox.delta.table import local_log_dir

    log_dir = local_log_dir(uri)
    if log_dir is None:
        return oldest_commit(list_log(uri, fs=fs))
    try:
        names = os.listdir(log_dir)
    except OSError as e:
        raise StoreError(f"listing the Delta log of {uri} failed: {e}") from e
    return min((int(n[:20]) for n in names if _COMMIT.match(n)), default=None)


def oldest_commit(files: list[LogFile]) -> int | None:
    """The oldest version whose commit file is still in the log (None: no commit file). A
    version below it is gone for every reader: its commit, change data and time travel."""
    return min((f.version for f in files if f.commit), default=None)


def named_paths(uri: str, files: list[LogFile], fs: Any) -> set[str]:
    """Every file path the retained log names (relative to the table): the ``add``, ``remove``
    and ``cdc`` actions of each commit file and the ``add``/``remove`` entries of each
    checkpoint. A file outside this set belongs to no version a reader can reach."""
    import pyarrow.parquet as pq

    named: set[str] = set()
    for f in files:
        try:
            if f.commit:
                for action in commit_actions(uri, f.version, fs):
                    for kind in ("add", "remove", "cdc"):
                        entry = action.get(kind)
                        if isinstance(entry, dict) and entry.get("path"):
                            named.add(unquote(str(entry["path"])))
            elif f.checkpoint:
                with fs.open_input_file(f.path) as stream:
                    table = pq.read_table(stream)
                for kind in ("add", "remove"):
                    if kind not in table.column_names:
                        continue
                    for entry in table.column(kind).to_pylist():
                        if isinstance(entry, dict) and entry.get("path"):
                            named.add(unquote(str(entry["path"])))
        except FileNotFoundError:
            continue  # trimmed meanwhile: what it named is older than what stays
        except (OSError, ValueError) as e:
            raise StoreError(f"reading {f.path} of {uri} failed: {e}") from e
    return named
