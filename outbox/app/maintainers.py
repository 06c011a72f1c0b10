"""Who may maintain a table now: one ``outbox maintain`` at a time for all its steps
(``one_maintainer``), and one rewrite of its files at a time (``exclusive``: the compaction's
lock, which ``maintain``'s repair takes too).

A table on the local disk is guarded by file locks beside its log (``flock``, released when the
process dies); a table on an object store, where no file lock holds, by the maintenance lease in
the SQL database (``outbox.app.lease``). Each yields None when this process holds the right, else
a line naming who does (the caller then skips its work).

Why apart from ``maintenance``: these say who, not what; ``maintenance`` asks them before its
steps, and still offers them under their old names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from outbox.app.lease import maintenance_lease
from outbox.core.clock import Clock
from outbox.delta.compaction import one_compactor
from outbox.delta.store import DeltaDocumentStore

#: The lock file beside a local table's log that one ``outbox maintain`` holds while it works.
MAINTAIN_LOCK = "_outbox_maintain.lock"


def exclusive(
    store: DeltaDocumentStore, sql_url: str, clock: Clock
) -> AbstractContextManager[str | None]:
    """One maintainer of the table at a time: the file lock beside a local table's log, the
    maintenance lease in the SQL database for a table on an object store (``outbox.app.lease``).
    Yields None when this process holds it, else who does."""
    if store._log_dir is not None:
        return one_compactor(store)
    return maintenance_lease(sql_url, store.table_id, clock=clock)


def one_maintainer(
    store: DeltaDocumentStore, sql_url: str, clock: Clock
) -> AbstractContextManager[str | None]:
    """One ``outbox maintain`` of the table at a time, for all its steps: a file lock beside a
    local table's log (not the compaction lock, which the compaction inside takes itself), the
    maintenance lease for a table on an object store. Yields None when this process holds it,
    else who does."""
    if store._log_dir is None:
        return maintenance_lease(sql_url, store.table_id, clock=clock)
    return _lock_file(store._log_dir.parent / MAINTAIN_LOCK)


@contextmanager
def _lock_file(path: Any) -> Iterator[str | None]:
    import fcntl

    with open(path, "a+b") as f:  # the folder is writable: ``check_writable`` said so
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield f"{path} is locked"
            return
        try:
            yield None
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
