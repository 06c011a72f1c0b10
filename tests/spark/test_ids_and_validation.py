"""The same ids on both engines, byte for byte; bad input fails before anything commits."""

from __future__ import annotations

from typing import Any

import pytest

from outbox.app.spark.ids import bucket_sql, command_id_sql, message_id_sql
from outbox.core.errors import MessageTooLargeError, ValidationError
from outbox.core.model import bucket_of, command_id_for, message_id_for
from tests.spark.test_apply import changes

pytestmark = pytest.mark.spark

CASES = [
    ("7f0c1b3e-table", "shipment-1", 1, None),
    ("7f0c1b3e-table", "shipment-1", 12345678901, "0123456789abcdef0123456789abcdef"),
    ("t|x", "ünïcødé id 'quoted'", 3, "ffffffffffffffffffffffffffffffff"),
]


def test_message_and_command_ids_match_the_python_functions(spark: Any) -> None:
    for table_id, doc_id, seq, inc in CASES:
        df = spark.createDataFrame([(doc_id, seq, inc)], "id string, seq bigint, inc string")
        row = df.selectExpr(
            f"{message_id_sql(table_id, 'id', 'seq', 'inc')} AS mid",
            f"{command_id_sql(table_id, 'id', 'seq', 'inc')} AS cid",
            f"{bucket_sql('id', 16)} AS bucket",
        ).first()
        assert row is not None
        assert row["mid"] == message_id_for(table_id, doc_id, seq, inc)
        assert row["cid"] == command_id_for(table_id, doc_id, seq, inc)
        assert row["bucket"] == bucket_of(doc_id, 16)


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([(None, "t", "{}", None, [])], "id is null"),
        ([("a", "t", "{}", None, []), ("a", "t", "{}", None, [])], "more than once"),
        ([("a", "t", "not json", None, [])], "state is not a JSON object"),
        ([("a", "t", "{}", None, [("M", "x" * 300_000, None)])], "oversized"),
        # UTF-8 bytes, as OutboxMessage.size_bytes: 1,000 characters of header, 2,000 bytes;
        # body + id (32) + type + content type (text/plain) + key + value = the limit + 1
        (
            [("a", "t", "{}", None, [("M", "x" * (262_144 - 2044 + 1), {"h": "é" * 1000})])],
            "is 262145 bytes",
        ),
    ],
)
def test_bad_rows_fail_before_anything_commits(
    sob: Any, spark: Any, rows: list[Any], needle: str
) -> None:
    before = sob.store.refresh()
    with pytest.raises(ValidationError, match=needle) as info:
        sob.apply(changes(spark, *rows))
    if "bytes" in needle or needle == "oversized":
        assert isinstance(info.value, MessageTooLargeError)
    assert sob.store.refresh() == before


def test_bad_columns_are_named(sob: Any, spark: Any) -> None:
    with pytest.raises(ValidationError, match="lack the column 'type'"):
        sob.apply(spark.createDataFrame([("a",)], "id string"))
    with pytest.raises(ValidationError, match="'expected_version' is string"):
        sob.apply(
            spark.createDataFrame(
                [("a", "t", "x")], "id string, type string, expected_version string"
            )
        )
    bad_dest = spark.createDataFrame(
        [("a", "t", [("M", "x", "no spaces allowed")])],
        "id string, type string, "
        "messages array<struct<type:string, body:string, destination:string>>",
    )
    with pytest.raises(ValidationError, match=r"messages\[0\]\.destination 'no spaces allowed'"):
        sob.apply(bad_dest)
