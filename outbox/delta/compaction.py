"""Compaction: rewriting a table's small files into larger ones, by one compactor at a time.

Small files make every MERGE slower (a 1-row MERGE rewrites the whole file holding the row).
Compaction emits no change rows (``dataChange=false``), so the rescuer never sees it. Why it has
its own module: deltalake 1.6.6 commits two concurrent compactions of one version (docs/delta.md),
so compacting safely takes a lock and a check after the commit, which the rest of the table's
upkeep (``outbox.app.maintenance``) does not need.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from outbox.core.errors import ConfigurationError, StoreError
from outbox.delta.log import commit_actions, commit_info, removed_by
from outbox.delta.store import DeltaDocumentStore

log = logging.getLogger("outbox.maintain")


def store_failure(what: str, store: DeltaDocumentStore, e: Exception) -> StoreError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return StoreError(f"{what} {store.uri} failed: {first}")


@contextlib.contextmanager
def one_compactor(store: DeltaDocumentStore) -> Iterator[str | None]:
    """An exclusive, non-blocking file lock per local table: yields None when this process holds
    it, else why not.

    Why: deltalake 1.6.6 committed two OPTIMIZEs that both read the same version and removed the
    same files (the checker's seed 47: versions 23 and 24), so every compacted row then existed
    twice. Two processes reaching ``compact_every`` together must not both compact. A table on
    an object store has no local log folder to lock: its compactions take the maintenance lease
    instead (``outbox.app.lease``), which the caller passes to ``compact``.
    """
    import fcntl

    assert store._log_dir is not None
    path = store._log_dir.parent / "_outbox_compact.lock"
    try:
        f = open(path, "a+b")  # noqa: SIM115 - closed by the with below, after the error check
    except OSError as e:  # a read-only folder or file: the environment, not a bug
        raise StoreError(
            f"cannot open the compaction lock {path}: {e.strerror or e}",
            hint=f"let the user running outbox write {path.parent} (or run where it is mounted "
            "writable)",
        ) from e
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield "another process is compacting"
            return
        try:
            yield None
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def compact(
    store: DeltaDocumentStore, *, lease: contextlib.AbstractContextManager[str | None] | None = None
) -> dict[str, Any]:
    """Rewrite small files into larger ones. A conflict with a writer is skipped, not raised.

    One compactor at a time: a local table takes a file lock; a table on an object store needs
    ``lease`` (the maintenance lease, ``outbox.app.lease``) and is refused without one. Either
    way, another holder means this compaction is skipped (reported, not raised).
    """
    from deltalake.exceptions import CommitFailedError

    guard: contextlib.AbstractContextManager[str | None]
    if store._log_dir is not None:
        guard = one_compactor(store)
    elif lease is not None:
        guard = lease
    else:
        raise ConfigurationError(
            f"compacting {store.uri} needs the maintenance lease (two compactions of a table on "
            "an object store at once duplicate its rows)",
            hint="run `outbox maintain`, which takes the lease in the SQL database",
        )
    with store._lock, guard as held:
        if held is not None:
            log.info("compaction skipped: %s", held)
            return {"skipped": held}
        try:
            store.refresh()
            metrics: dict[str, Any] = store.delta_table.optimize.compact()
        except CommitFailedError as e:
            log.info("compaction skipped: a writer committed meanwhile (%s)", e)
            return {"skipped": "conflict"}
        except Exception as e:
            raise store_failure("compacting", store, e) from e
        if metrics.get("numFilesRemoved"):
            _check_no_double_compaction(store, store.version())
    return {
        k: metrics.get(k)
        for k in ("numFilesAdded", "numFilesRemoved", "partitionsOptimized", "totalConsideredFiles")
    }


def _check_no_double_compaction(store: DeltaDocumentStore, version: int) -> None:
    """Fail loudly when another compaction, committed after this one read the table, had
    already removed files this one removed: their rows now exist twice.

    Why: deltalake 1.6.6 does not treat two data-neutral removals of one file as a conflict
    (docs/delta.md), and the file lock in ``one_compactor`` covers only processes on one
    machine. Remote tables turn automatic compaction off for the same reason; this check catches
    two ``outbox maintain`` jobs that overlap, and any other compactor of the table.
    """
    opts = store._storage_options
    ours = commit_actions(store.uri, version, storage_options=opts)
    read = commit_info(ours).get("readVersion")
    removed, _ = removed_by(ours)
    if not isinstance(read, int) or not removed:
        return
    for other in range(read + 1, version):
        theirs, neutral = removed_by(commit_actions(store.uri, other, storage_options=opts))
        both = removed & theirs
        if both and neutral:
            raise StoreError(
                f"compaction commit {version} of {store.uri} removed {len(both)} file(s) that "
                f"commit {other} (another compaction of the same version {read}) had already "
                "removed: the rows they held now exist twice",
                hint="run `outbox maintain --repair`, which removes the second copies (saves "
                "of the damaged documents are refused until then); then compact from one "
                "process only: `outbox maintain` takes the maintenance lease",
            )
