"""Where a marker still is, byte for byte: the erasure proof's eyes (tests/erasure).

A reader's "not found" only says what a reader sees. This looks at every file instead: the raw
bytes (a log line, a SQLite page, an uncompressed Parquet page) AND every Parquet file decoded
row by row, because a compressed page (Snappy, zstd) can hide a literal the raw bytes would show.
It works on a local folder and on any pyarrow filesystem (an object store through deltalake's
``DeltaStorageHandler``), so the same proof runs on both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Hit:
    """One file holding the marker; ``how``: ``bytes`` or ``parquet`` (only once decoded)."""

    path: str
    how: str


def parquet_holds(data: bytes, marker: str) -> bool:
    """Whether any value of a Parquet file, decoded, contains ``marker`` (False for a file that
    is not Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError):
        return False
    return any(marker in repr(column.to_pylist()) for column in table.columns)


def scan_bytes(path: str, data: bytes, marker: str) -> Hit | None:
    if marker.encode() in data:
        return Hit(path, "bytes")
    if path.endswith(".parquet") and parquet_holds(data, marker):
        return Hit(path, "parquet")
    return None


def scan_folder(root: Path, marker: str) -> list[Hit]:
    """Every file under ``root`` holding ``marker`` (a SQLite database, its WAL, a table)."""
    hits = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        hit = scan_bytes(str(path.relative_to(root)), path.read_bytes(), marker)
        if hit is not None:
            hits.append(hit)
    return hits


def scan_filesystem(fs: Any, marker: str, base: str = "") -> list[Hit]:
    """Every file of a pyarrow filesystem under ``base`` holding ``marker``."""
    import pyarrow.fs as pfs

    infos = fs.get_file_info(pfs.FileSelector(base, recursive=True, allow_not_found=True))
    hits = []
    for info in sorted(infos, key=lambda i: str(i.path)):
        if info.type != pfs.FileType.File:
            continue
        with fs.open_input_stream(info.path) as stream:
            data = stream.read()
        hit = scan_bytes(str(info.path), data, marker)
        if hit is not None:
            hits.append(hit)
    return hits


def scan_table(uri: str, marker: str, storage_options: dict[str, str] | None = None) -> list[Hit]:
    """Every file of a Delta table (local or on an object store) holding ``marker``."""
    import pyarrow.fs as pfs
    from deltalake.fs import DeltaStorageHandler

    fs = pfs.PyFileSystem(DeltaStorageHandler(uri, storage_options or None))
    return scan_filesystem(fs, marker)


def places(hits: Iterable[Hit]) -> set[str]:
    """Which part of a table each hit is in: ``data``, ``_change_data`` or ``_delta_log``."""
    out = set()
    for hit in hits:
        top = hit.path.lstrip("/").split("/", 1)[0]
        out.add(top if top in ("_change_data", "_delta_log") else "data")
    return out
