"""The orphan sweep: data files no version of the table names any more, older than a retention.

Why the trim is not enough: ``trim_log`` deletes the data files its trimmed commits *removed*,
but a file no commit ever named (an append whose commit failed, or whose writer died between
writing the file and committing it) is named by nothing it reads. deltalake's vacuum does not
help either: its lite mode deletes only tombstoned files, and its full mode deletes every
unnamed file with no age check, so it can delete the file of an append about to commit
(docs/delta.md, "Vacuum guard"). An erasure must not leave a document's rows in such a file.

The rule: list the table's data files (everything outside ``_delta_log`` and ``_change_data``),
keep every path the retained log names (``outbox.delta.log.named_paths``: commits and
checkpoints), keep every file younger than ``retention`` (an append in flight wrote its file
moments ago), delete the rest. ``_change_data`` files are left to the log trim, which deletes
each with the commit that wrote it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from outbox.core.errors import StoreError
from outbox.delta.log import LOG_DIR, _filesystem, list_log, named_paths

log = logging.getLogger("outbox.maintain")

CHANGE_DIR = "_change_data"


def data_files(fs: Any) -> list[tuple[str, datetime | None]]:
    """(path, modification time) of every Parquet file outside the log and the change data."""
    import pyarrow.fs as pfs

    infos = fs.get_file_info(pfs.FileSelector("", recursive=True, allow_not_found=True))
    out: list[tuple[str, datetime | None]] = []
    for info in infos:
        path = info.path.lstrip("/")
        top = path.split("/", 1)[0]
        if info.type != pfs.FileType.File or top in (LOG_DIR, CHANGE_DIR):
            continue
        if path.endswith(".parquet"):
            out.append((path, info.mtime))
    return out


def sweep_orphans(
    uri: str,
    *,
    now: datetime,
    retention: timedelta,
    storage_options: Mapping[str, str] | None = None,
    dry_run: bool = False,
) -> list[str]:
    """Delete the data files no retained commit or checkpoint names, last modified before
    ``now - retention``; returns their paths (what it would delete, with ``dry_run``)."""
    fs = _filesystem(uri, storage_options or {})
    files = list_log(uri, fs=fs)
    if not any(f.commit or f.checkpoint for f in files):
        return []  # no log to compare with: never guess
    try:
        present = data_files(fs)
    except OSError as e:
        raise StoreError(f"listing the data files of {uri} failed: {e}") from e
    named = named_paths(uri, files, fs)
    cutoff = now - retention
    doomed = sorted(
        path
        for path, mtime in present
        if path not in named and mtime is not None and mtime <= cutoff
    )
    if dry_run:
        return doomed
    for path in doomed:
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreError(
                f"deleting the orphan data file {path} of {uri} failed: {e}",
                hint="the table is intact (no version names the file); fix access and run "
                "`outbox maintain` again",
            ) from e
    if doomed:
        log.info("deleted %d orphan data file(s) of %s", len(doomed), uri)
    return doomed
