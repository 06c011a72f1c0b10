"""The id functions of ``outbox.core.model`` as Spark SQL expressions, byte for byte.

A message written by Spark must carry exactly the ``message_id`` the Python write path would give
it for the same (table, document, seq, incarnation), and a rescued document the same
``ProcessDocument`` command id, or duplicate detection downstream would not recognise a re-send.
These are SQL *strings* (not Column objects) because the MERGE's update and insert actions take
SQL text that refers to the target (``t.``) and source (``s.``) aliases; tests/spark/test_ids.py
compares them with the Python functions on the same inputs, null incarnation included.

``concat_ws`` skips a null, which is exactly how ``model._id_source`` treats a legacy row's null
incarnation.
"""

from __future__ import annotations


def sql_str(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def message_id_sql(table_id: str, doc_id: str, seq: str, incarnation: str) -> str:
    """``message_id_for(table_id, id, seq, incarnation)``; the arguments are SQL expressions
    except ``table_id``, a plain value."""
    return (
        f"substr(sha2(concat_ws('|', {sql_str(table_id)}, {doc_id}, cast({seq} as string), "
        f"{incarnation}), 256), 1, 32)"
    )


def command_id_sql(table_id: str, doc_id: str, up_to_seq: str, incarnation: str) -> str:
    """``command_id_for(table_id, id, up_to_seq, incarnation)`` as SQL."""
    return (
        f"concat('pd-', substr(sha2(concat_ws('|', 'process', {sql_str(table_id)}, {doc_id}, "
        f"cast({up_to_seq} as string), {incarnation}), 256), 1, 32))"
    )


def bucket_sql(doc_id: str, buckets: int) -> str:
    """``bucket_of(id, N)``: Spark's ``crc32`` is the same unsigned CRC-32 as ``zlib.crc32``."""
    return f"cast(crc32({doc_id}) % {int(buckets)} as int)"


def incarnation_sql(token: str, doc_id: str) -> str:
    """A new document's incarnation: 32 lowercase hex characters, like ``new_incarnation()``.

    Why not ``uuid()``: the value must be the same in the row and in its message ids, and a
    MERGE may evaluate its source more than once. Hashing a per-apply random token with the id is
    deterministic within the apply and still never repeats across applies.
    """
    return f"substr(sha2(concat({sql_str(token)}, '|', {doc_id}), 256), 1, 32)"
