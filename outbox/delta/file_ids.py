"""Which ids each data file holds, read once per file, so that showing a new document's id is
absent does not read every file of the buckets a unit of work touches.

Why: a creation must show its id is absent from the table. With random ids (a device's or an
order's uuid) no file's min/max statistics rule an id out, so the SQL read behind ``read`` and
the save's re-check opened every file of each bucket it touched, on every commit: 600-800 ms a
commit locally, and on Azurite 1.4 s growing to 9 s within 43 commits as files accumulated
between maintenance runs (issue 47's quick run, docs/delta.md). A data file never changes once
written (an add action names an immutable object), so the ids it holds are read once and kept;
later commits read only the files this process has not seen (its own last commit's, another
writer's, a compaction's).

The index only ever *removes* ids from the SQL read: an id that no live data file of its bucket
holds is absent at that snapshot; an id some file may hold (a hash match, a file or table the
index cannot read) is read by SQL as before. So a wrong answer here can cost a read, never make
a document look absent (``tests/write_path/test_file_ids.py``, with the mutation that makes it
claim absence).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

log = logging.getLogger("outbox.delta")

#: Ids kept across every cached file (8 bytes each, 80 MB at most): a table holding more is read
#: by SQL, as before the index.
MAX_IDS = 10_000_000


class _Full(Exception):
    """The ids of the files a read needs do not fit in ``max_ids``."""


class _Unreadable(Exception):
    """A table or file the index must not answer for."""


def _hashes(ids: Sequence[str]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Process-local hashes: the index lives and dies with the process, so ``hash`` will do; a
    collision only sends an id to the SQL read."""
    return np.fromiter((hash(i) for i in ids), dtype=np.int64, count=len(ids))


class FileIds:
    """path -> the sorted hashes of the ids in that data file, for the files this process read."""

    def __init__(
        self, storage_options: dict[str, str] | None = None, max_ids: int = MAX_IDS
    ) -> None:
        self._storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._max_ids = max_ids
        self._files: dict[str, np.ndarray[Any, np.dtype[np.int64]]] = {}
        self._held = 0
        self.files_read = 0  # for tests and benchmarks: files whose ids were read
        self.files_noted = 0  # files whose ids this process's own append told (``wrote``)
        #: The snapshot the last answer was given at: its files and its version.
        self._live: dict[str, int] = {}
        self._live_version = -1
        self.disabled: str | None = None  # why the index stopped answering (then: SQL reads)

    def maybe_present(
        self, dt: Any, ids: Sequence[str], bucket: Callable[[str], int]
    ) -> list[str] | None:
        """The ``ids`` some live data file of their bucket may hold, at ``dt``'s snapshot, in
        their order; None when the index cannot tell (then read them all). The caller holds
        the store's lock (every caller does: ``read``, the re-check, the marks' append)."""
        if self.disabled is not None:
            return None
        if not ids:
            return []
        try:
            return self._maybe_present(dt, ids, bucket)
        except _Full:  # more ids than the index keeps: every read is SQL's from now on
            self._off(f"the table holds more than {self._max_ids:,} ids")
        except OSError as e:  # the store did not answer this time: SQL now, the index next time
            log.debug("file id index: %s; this read goes to SQL", e)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # deltalake's Rust panics are BaseExceptions, not Exceptions
            self._off(f"{type(e).__name__}: {e}")
        return None

    def _maybe_present(
        self, dt: Any, ids: Sequence[str], bucket: Callable[[str], int]
    ) -> list[str]:
        live = _live_files(dt)
        self._live, self._live_version = live, int(dt.version())
        buckets = np.fromiter((bucket(i) for i in ids), dtype=np.int64, count=len(ids))
        wanted = set(buckets.tolist())
        self._forget([p for p in self._files if p not in live])
        missing = [p for p, b in live.items() if b in wanted and p not in self._files]
        if missing:
            self._read(dt, missing)
        by_bucket: dict[int, list[str]] = {}
        for p, b in live.items():
            if b in wanted and len(self._files[p]):  # an empty file holds nothing
                by_bucket.setdefault(b, []).append(p)
        hashes = _hashes(ids)
        hit = np.zeros(len(ids), dtype=bool)
        for b, paths in by_bucket.items():
            mine = buckets == b
            h = hashes[mine]
            seen = np.zeros(len(h), dtype=bool)
            for p in paths:
                held = self._files[p]
                at = np.minimum(np.searchsorted(held, h), len(held) - 1)
                seen |= held[at] == h
            hit[np.flatnonzero(mine)[seen]] = True
        return [i for i, h in zip(ids, hit, strict=True) if h]

    def wrote(self, dt: Any, ids: Sequence[str], bucket: Callable[[str], int], before: int) -> None:
        """This process's append of rows with ``ids`` just committed on top of version
        ``before``: note its files' ids without reading them back.

        Why: each commit's re-check read the previous commit's own file back (one small parquet
        through the table's filesystem, 30-40 ms: as much as the append itself, with 64 threads
        committing one document each; benchmarks/small_writers.py). Only when the index answered
        at ``before`` and the table is now at ``before + 1`` are the new files certainly this
        append's; each new file of a bucket is given every id the append wrote to that bucket
        (a superset when deltalake split a bucket into files, which only costs a read later).
        Otherwise nothing is noted and the next answer reads the files as before."""
        if self.disabled is not None or self._live_version != before:
            return
        try:
            if int(dt.version()) != before + 1:
                return
            live = _live_files(dt)
        except Exception as e:  # the next answer reads them
            log.debug("file id index: %s; the append's files are read later", e)
            return
        new = [p for p in live if p not in self._live]
        by_bucket: dict[int, list[str]] = {}
        for i in ids:
            by_bucket.setdefault(bucket(i), []).append(i)
        for p in new:
            mine = by_bucket.get(live[p])
            if mine is None:  # not a bucket this append wrote: leave it to a read
                continue
            held = np.unique(_hashes(mine))
            if self._held + len(held) > self._max_ids:
                return
            self._files[p] = held
            self._held += len(held)
            self.files_noted += 1
        self._live, self._live_version = live, before + 1

    def _off(self, why: str) -> None:
        self.disabled = why
        log.warning("file id index off for this table (%s): ids are read by SQL", why)
        self._forget(list(self._files))

    def _read(self, dt: Any, paths: list[str]) -> None:
        """Read the id column of ``paths`` through deltalake's own filesystem for the table
        (``to_pyarrow_dataset`` would build a fragment for every file of the table first).
        Refused (the index steps aside): a table with column mapping (the file's ``id`` may
        be another column), a path that is not relative to the table (a shallow clone's: the
        filesystem cannot open it), an ``id`` that is not a string column."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        mapping = (dt.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
        if mapping != "none":
            raise _Unreadable(f"column mapping ({mapping})")
        for p in paths:
            if "://" in p or p.startswith("/"):
                raise _Unreadable(f"a data file outside the table's folder ({p})")
            column = pq.read_table(p, columns=["id"], filesystem=self._filesystem(dt)).column(0)
            kind = column.type
            if pa.types.is_dictionary(kind):
                kind = kind.value_type
            if not (
                pa.types.is_string(kind)
                or pa.types.is_large_string(kind)
                or pa.types.is_string_view(kind)
            ):
                raise _Unreadable(f"the id column of {p} is {column.type}, not a string")
            held = np.unique(_hashes([i for i in column.to_pylist() if i is not None]))
            if self._held + len(held) > self._max_ids:
                raise _Full
            self._files[p] = held
            self._held += len(held)
            self.files_read += 1

    def _filesystem(self, dt: Any) -> Any:
        if self._fs is None:
            import pyarrow.fs as pa_fs
            from deltalake.fs import DeltaStorageHandler

            handler = DeltaStorageHandler(dt.table_uri, self._storage_options)
            self._fs = pa_fs.PyFileSystem(handler)
        return self._fs

    def _forget(self, paths: list[str]) -> None:
        for p in paths:
            self._held -= len(self._files.pop(p))


def _live_files(dt: Any) -> dict[str, int]:
    """Every data file of the snapshot -> its bucket."""
    adds = dt.get_add_actions(flatten=False)  # no statistics flattened: a third of the time
    paths = adds.column("path").to_pylist()
    parts = adds.column("partition").to_pylist()
    return {str(p): int(v["bucket"]) for p, v in zip(paths, parts, strict=True)}
