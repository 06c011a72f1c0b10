"""The store's deltalake handle, kept current at the lowest cost deltalake allows.

Why a module of its own: two deltalake 1.6.6 behaviours set the cost of every read and commit
over a long run (docs/delta.md, "Surprises" 6 and 7), and both are answered here.

- ``update_incremental`` is not incremental (delta-rs issue #4276): it replays the log from the
  checkpoint the handle was *opened* at and lists the log, even when nothing is new. A commit
  is an atomic put of ``<version + 1>.json``, so when that file does not exist the handle is
  current: a stat answers that in microseconds (one HEAD request on an object store, through
  deltalake's own ``DeltaStorageHandler`` and credentials).
- A handle never moves on to a newer checkpoint, so one kept over a long run pays, on every
  refresh and commit, for every commit since it was opened. The handle is opened afresh every
  ``REOPEN_EVERY`` versions, which loads from the newest checkpoint (deltalake writes one every
  100 commits).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from outbox.delta.table import deltalake, local_log_dir, open_table, store_error

log = logging.getLogger("outbox.store")

#: Versions a handle follows before it is opened afresh (deltalake's checkpoint interval).
REOPEN_EVERY = 100
_NOT_FOUND = 0  # pyarrow.fs.FileType.NotFound


class TableHandle:
    """A ``deltalake.DeltaTable`` on ``uri`` (``table``) and the refresh that keeps it current."""

    def __init__(self, uri: str, storage_options: Mapping[str, str]) -> None:
        self.uri = uri
        self._options = dict(storage_options)
        self._log_dir = local_log_dir(uri)
        self._files: Any = None  # DeltaStorageHandler, made on the first object-store stat
        self.table: Any = None
        self._opened_at = 0
        self.reopen()

    def reopen(self) -> None:
        """A fresh handle: it loads from the newest Delta checkpoint."""
        self.table = open_table(self.uri, self._options)
        self._opened_at = int(self.table.version())

    def update(self) -> None:
        """Bring the handle to the newest version, with driver errors translated."""
        version = int(self.table.version())
        if version - self._opened_at >= REOPEN_EVERY:
            self.reopen()
            return
        if self._is_current(version):
            return
        dl = deltalake()
        try:
            self.table.update_incremental()
        except (OSError, dl.exceptions.DeltaError) as e:
            if "invalid table version" not in str(e).lower():
                raise store_error(f"refreshing {self.uri} failed", e) from e
            # The log was trimmed past this handle's version: open the table afresh (it loads
            # from the newest checkpoint, which the trim always keeps).
            log.info("the handle's version %d was trimmed from the log; reopening", version)
            self.reopen()

    def _is_current(self, version: int) -> bool:
        """Whether no commit follows ``version``. Both files: the log trim (outbox.delta.log)
        may have deleted the commits after an idle handle's version, and then the absence of
        the next one proves nothing."""
        names = [f"{version + 1:020d}.json", f"{version:020d}.json"]
        if self._log_dir is not None:
            return not (self._log_dir / names[0]).exists() and (self._log_dir / names[1]).exists()
        try:
            following, this = self._log_files().get_file_info([f"_delta_log/{n}" for n in names])
        except Exception:  # the refresh that follows reports what is wrong, in our words
            return False
        return bool(following.type == _NOT_FOUND and this.type != _NOT_FOUND)

    def _log_files(self) -> Any:
        if self._files is None:
            from deltalake.fs import DeltaStorageHandler

            self._files = DeltaStorageHandler(self.uri, self._options or None)
        return self._files
