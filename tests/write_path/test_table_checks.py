"""Every component refuses a table it cannot trust, with an error that says how to fix it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from migrations.delta import ensure_table
from outbox.core.errors import (
    ChangeDataFeedDisabledError,
    SchemaMismatchError,
    TableNotFoundError,
)
from outbox.delta import schema as S
from outbox.delta.store import DeltaDocumentStore


def _doc_table_without_cdf(path: Path) -> None:
    DeltaTable.create(
        str(path),
        schema=S.DOCUMENT_SCHEMA,
        partition_by=["bucket"],
        description=S.describe_table(1, 16, "tid"),
    )


def test_missing_table(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError, match="run `outbox migrate`"):
        DeltaDocumentStore(str(tmp_path / "nope"))


def test_table_without_change_data_feed_is_refused(tmp_path: Path) -> None:
    _doc_table_without_cdf(tmp_path / "t")
    with pytest.raises(ChangeDataFeedDisabledError, match="change data feed"):
        DeltaDocumentStore(str(tmp_path / "t"))


def test_migrate_turns_the_feed_on_for_an_existing_document_table(tmp_path: Path) -> None:
    _doc_table_without_cdf(tmp_path / "t")
    done = ensure_table(str(tmp_path / "t"), buckets=16)
    assert done == [
        f"enabled the change data feed on {tmp_path / 't'}",
        "set delta.setTransactionRetentionDuration = 'interval 1 days' on "
        f"{tmp_path / 't'} (without it no checkpoint drops an application transaction; the "
        "saves' own are written expired, so it bounds only other writers')",
        "set delta.deletedFileRetentionDuration = 'interval 15 minutes' on "
        f"{tmp_path / 't'} (how long a removed file's tombstone stays in the checkpoints; the "
        "log trim deletes removed files, so a vacuum of your own should be `outbox maintain`)",
        f"recorded outbox schema version 3 on {tmp_path / 't'} (saves append a row per document "
        "version and deletes write a tombstone version from now on; the rows already there read "
        "the same; releases before it refuse the table)",
    ]
    store = DeltaDocumentStore(str(tmp_path / "t"))
    assert store.table_id == "tid"
    assert ensure_table(str(tmp_path / "t"), buckets=16) == []


def test_foreign_schema_is_refused_by_store_and_migrate(tmp_path: Path) -> None:
    write_deltalake(
        str(tmp_path / "t"),
        pa.table({"id": ["a"], "payload": ["x"]}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    with pytest.raises(SchemaMismatchError, match="missing column 'version'"):
        DeltaDocumentStore(str(tmp_path / "t"))
    with pytest.raises(SchemaMismatchError, match="migrate never rewrites a foreign table"):
        ensure_table(str(tmp_path / "t"), buckets=16)


def test_wrong_column_type_is_refused(tmp_path: Path) -> None:
    fields = [
        pa.field("version", pa.string()) if f.name == "version" else f for f in S.DOCUMENT_SCHEMA
    ]
    DeltaTable.create(
        str(tmp_path / "t"),
        schema=pa.schema(fields),
        partition_by=["bucket"],
        configuration={"delta.enableChangeDataFeed": "true"},
        description=S.describe_table(1, 16, "tid"),
    )
    with pytest.raises(SchemaMismatchError, match="column 'version' is string, expected int64"):
        DeltaDocumentStore(str(tmp_path / "t"))


def test_unpartitioned_document_table_is_refused(tmp_path: Path) -> None:
    DeltaTable.create(
        str(tmp_path / "t"),
        schema=S.DOCUMENT_SCHEMA,
        configuration={"delta.enableChangeDataFeed": "true"},
        description=S.describe_table(1, 16, "tid"),
    )
    with pytest.raises(SchemaMismatchError, match="partitioned by"):
        DeltaDocumentStore(str(tmp_path / "t"))


def test_table_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    DeltaTable.create(
        str(tmp_path / "t"),
        schema=S.DOCUMENT_SCHEMA,
        partition_by=["bucket"],
        configuration={"delta.enableChangeDataFeed": "true"},
        description=S.describe_table(99, 16, "tid"),
    )
    with pytest.raises(SchemaMismatchError, match="upgrade delta-outbox"):
        DeltaDocumentStore(str(tmp_path / "t"))


def test_closed_store_is_refused(tmp_path: Path) -> None:
    from outbox.core.errors import ClosedError

    DeltaDocumentStore.create(str(tmp_path / "t"))
    store = DeltaDocumentStore(str(tmp_path / "t"))
    store.close()
    with pytest.raises(ClosedError, match="document store is closed"):
        store.read(["a"])


def test_migrate_refuses_to_record_a_bucket_count_the_rows_do_not_follow(tmp_path: Path) -> None:
    """A table written by another tool with crc32(id) % 8, migrated with the default 16."""
    from outbox.core.model import bucket_of

    uri = str(tmp_path / "t")
    DeltaTable.create(uri, schema=S.DOCUMENT_SCHEMA, partition_by=["bucket"])
    ids = [f"doc-{i}" for i in range(20)]
    rows = {f.name: [] for f in S.DOCUMENT_SCHEMA}  # type: dict[str, list[object]]
    for i in ids:
        for name, value in (
            ("id", i), ("type", "T"), ("version", 1), ("state", "{}"), ("last_seq", 0),
            ("dispatched_seq", 0), ("outbox", []), ("updated_at", None),
            ("bucket", bucket_of(i, 8)), ("incarnation", None), ("deleted", None),
        ):  # fmt: skip
            rows[name].append(value)
    write_deltalake(uri, pa.table(rows, schema=S.DOCUMENT_SCHEMA), mode="append")
    with pytest.raises(SchemaMismatchError, match=r"not crc32\(id\) % 16"):
        ensure_table(uri, buckets=16)
    done = ensure_table(uri, buckets=8)
    assert any("recorded outbox schema version" in d for d in done)
    assert DeltaDocumentStore(uri).buckets == 8
