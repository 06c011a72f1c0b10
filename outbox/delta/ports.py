"""What the rest of the product needs from a document store: the ``DocumentStore`` protocol.

Why a protocol when there is one implementation: the same table lives on a local disk, on Azure
(ADLS Gen2 / Blob) and on S3, and the store's contract suite
(``outbox.testing.contracts.document_store``) states, once, what must hold on each of them; a
store for another table format would be held to the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import pyarrow as pa

from outbox.core.model import DocumentRow
from outbox.delta.group_commit import DocumentWrite


class DocumentStore(Protocol):
    """Documents with optimistic saves and monotonic watermarks (docs/design.md, section 2)."""

    uri: str

    def version(self) -> int: ...

    def refresh(self) -> int: ...

    def read(
        self, ids: Sequence[str], *, barrier: bool = True
    ) -> tuple[int, dict[str, DocumentRow]]: ...

    def save(self, writes: Sequence[DocumentWrite]) -> int: ...

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None: ...

    def scan_pending(self, columns: list[str] | None = None) -> pa.Table: ...

    def close(self) -> None: ...
