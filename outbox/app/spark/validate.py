"""Checking and normalising the ``changes`` DataFrame before anything is written.

Two steps, both before the MERGE: ``normalize`` checks the *schema* on the driver (no Spark job)
and rewrites the frame into the shape the MERGE takes; ``check_rows`` runs *one* aggregation job
that finds the first bad row (with the rule it breaks), counts the rows, spots an id named twice
and gathers the touched buckets (the MERGE's literal filter). Bad input raises one
``ValidationError`` naming the column, and the row's id, and nothing is committed.

The rules are those of ``Document.send`` and ``UnitOfWork.create``: ids and ordering keys are
non-empty, at most 128 characters, without control characters; a destination is a queue or topic
name (or the configured default); a message is at most ``max_message_bytes`` (UTF-8 bytes of
the body and properties, as ``OutboxMessage.size_bytes``); ``deliver_at`` is a timestamp. A
string body defaults to ``text/plain``, a struct, map or array body is written as JSON with
``application/json``, as in Python.

Several changes for one id in one batch are refused (decided, not an accident): their order is
not defined by a DataFrame, and applying them "in order" would need an order column the caller
must supply anyway. Combine them first (the last state, the messages concatenated in order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outbox.app.spark.ids import bucket_sql
from outbox.core.errors import MessageTooLargeError, ValidationError
from outbox.core.model import MAX_ID_LENGTH

REQUIRED = ("id", "type")
OPTIONAL = ("state", "expected_version", "messages")
MESSAGE_FIELDS = (
    "type",
    "body",
    "destination",
    "ordering_key",
    "headers",
    "content_type",
    "correlation_id",
    "deliver_at",
)
_DESTINATION = r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,259}$"
_CONTROL = r"[\x00-\x1f\x7f]"


@dataclass(frozen=True, slots=True)
class Checked:
    """What the validation job learned: rows, and the buckets the MERGE may touch."""

    rows: int
    messages: int
    buckets: list[int]


def _types() -> Any:
    from pyspark.sql import types as T

    return T


def normalize(
    changes: Any, *, buckets: int, default_destination: str | None, created_at: Any
) -> Any:
    """The MERGE source: id, type, state, _expected, messages (normalised), bucket."""
    from pyspark.sql import functions as F

    T = _types()
    fields = {f.name: f.dataType for f in changes.schema.fields}
    for name in REQUIRED:
        if name not in fields:
            raise ValidationError(
                f"changes lack the column {name!r}",
                hint="changes need id, type and optionally state, expected_version, messages",
            )
        if not isinstance(fields[name], T.StringType):
            raise ValidationError(f"column {name!r} is {fields[name].simpleString()}, not string")
    state = F.lit(None).cast("string")
    if "state" in fields:
        st = fields["state"]
        if isinstance(st, T.StringType):
            state = F.col("state")
        elif isinstance(st, T.StructType | T.MapType):
            state = F.to_json(F.col("state"))
        else:
            raise ValidationError(
                f"column 'state' is {st.simpleString()}; use a JSON string or a struct"
            )
    expected = F.lit(None).cast("long")
    if "expected_version" in fields:
        ev = fields["expected_version"]
        if not isinstance(ev, T.IntegralType):
            raise ValidationError(
                f"column 'expected_version' is {ev.simpleString()}; use an integer (or null)"
            )
        expected = F.col("expected_version").cast("long")
    messages = F.array().cast(_message_array_type())
    if "messages" in fields:
        messages = _messages(fields["messages"], default_destination, created_at)
    return changes.select(
        F.col("id"),
        F.col("type"),
        state.alias("state"),
        expected.alias("_expected"),
        F.coalesce(messages, F.array().cast(_message_array_type())).alias("messages"),
        F.expr(bucket_sql("id", buckets)).alias("bucket"),
    )


def _message_array_type() -> Any:
    T = _types()
    return T.ArrayType(
        T.StructType(
            [
                T.StructField("type", T.StringType()),
                T.StructField("body", T.StringType()),
                T.StructField("destination", T.StringType()),
                T.StructField("content_type", T.StringType()),
                T.StructField("headers", T.StringType()),
                T.StructField("ordering_key", T.StringType()),
                T.StructField("correlation_id", T.StringType()),
                T.StructField("deliver_at", T.TimestampType()),
                T.StructField("created_at", T.TimestampType()),
            ]
        )
    )


def _messages(dtype: Any, default_destination: str | None, created_at: Any) -> Any:
    from pyspark.sql import functions as F

    T = _types()
    if not isinstance(dtype, T.ArrayType) or not isinstance(dtype.elementType, T.StructType):
        raise ValidationError(
            f"column 'messages' is {dtype.simpleString()}; use an array of structs with type, "
            "body and optionally destination, ordering_key, headers, content_type, "
            "correlation_id, deliver_at"
        )
    have = {f.name: f.dataType for f in dtype.elementType.fields}
    unknown = sorted(set(have) - set(MESSAGE_FIELDS))
    if unknown:
        raise ValidationError(
            f"column 'messages' has unknown field(s) {', '.join(unknown)}",
            hint=f"message fields are {', '.join(MESSAGE_FIELDS)}",
        )
    for name in ("type", "body"):
        if name not in have:
            raise ValidationError(f"column 'messages' lacks the field {name!r}")
    for name in ("type", "destination", "ordering_key", "content_type", "correlation_id"):
        if name in have and not isinstance(have[name], T.StringType):
            raise ValidationError(
                f"column 'messages.{name}' is {have[name].simpleString()}, not string"
            )
    body_t = have["body"]
    if isinstance(body_t, T.BinaryType):
        raise ValidationError(
            "column 'messages.body' is binary; decode it to UTF-8 text (or base64) first"
        )
    if not isinstance(body_t, T.StringType | T.StructType | T.MapType | T.ArrayType):
        raise ValidationError(
            f"column 'messages.body' is {body_t.simpleString()}; use a string or a struct"
        )
    if "headers" in have and not (
        isinstance(have["headers"], T.MapType)
        and isinstance(have["headers"].keyType, T.StringType)
        and isinstance(have["headers"].valueType, T.StringType)
    ):
        raise ValidationError(
            f"column 'messages.headers' is {have['headers'].simpleString()}; use map<string,string>"
        )
    if "deliver_at" in have and not isinstance(have["deliver_at"], T.TimestampType):
        raise ValidationError(
            f"column 'messages.deliver_at' is {have['deliver_at'].simpleString()}; use a timestamp"
        )
    is_text = isinstance(body_t, T.StringType)
    default_ct = "text/plain" if is_text else "application/json"

    def field(m: Any, name: str) -> Any:
        return m[name] if name in have else F.lit(None)

    def one(m: Any) -> Any:
        body = m["body"] if is_text else F.to_json(m["body"])
        headers = (
            F.when(F.size(m["headers"]) > 0, F.to_json(m["headers"]))
            if "headers" in have
            else F.lit(None)
        )
        dest = field(m, "destination")
        if default_destination is not None:
            dest = F.coalesce(dest, F.lit(default_destination))
        return F.struct(
            m["type"].alias("type"),
            body.alias("body"),
            dest.cast("string").alias("destination"),
            F.coalesce(field(m, "content_type").cast("string"), F.lit(default_ct)).alias(
                "content_type"
            ),
            headers.cast("string").alias("headers"),
            field(m, "ordering_key").cast("string").alias("ordering_key"),
            field(m, "correlation_id").cast("string").alias("correlation_id"),
            field(m, "deliver_at").cast("timestamp").alias("deliver_at"),
            F.lit(created_at).cast("timestamp").alias("created_at"),
        )

    return F.transform(F.col("messages"), one)


def _id_problem(col: Any, what: str) -> Any:
    from pyspark.sql import functions as F

    return (
        F.when(col.isNull(), F.lit(f"{what} is null"))
        .when(F.length(F.trim(col)) == 0, F.lit(f"{what} is empty"))
        .when(F.length(col) > MAX_ID_LENGTH, F.lit(f"{what} is longer than {MAX_ID_LENGTH}"))
        .when(col.rlike(_CONTROL), F.lit(f"{what} contains control characters"))
    )


def _row_problem(max_message_bytes: int) -> Any:
    """The first rule a row breaks, as text (null when the row is fine)."""
    from pyspark.sql import functions as F

    def message_problem(m: Any, i: Any) -> Any:
        where = F.concat(F.lit("messages["), i.cast("string"), F.lit("]."))
        # OutboxMessage.size_bytes: UTF-8 bytes of the body and the properties (the message id
        # is always 32 characters)
        size = (
            F.octet_length(m["body"])
            + F.lit(32)
            + F.coalesce(F.octet_length(m["type"]), F.lit(0))
            + F.coalesce(F.octet_length(m["content_type"]), F.lit(0))
            + F.coalesce(F.octet_length(m["ordering_key"]), F.lit(0))
            + F.coalesce(F.octet_length(m["correlation_id"]), F.lit(0))
            + F.coalesce(
                F.aggregate(
                    F.map_entries(F.from_json(m["headers"], "map<string,string>")),
                    F.lit(0),
                    lambda acc, e: acc + F.octet_length(e["key"]) + F.octet_length(e["value"]),
                ),
                F.lit(0),
            )
        )
        problem = (
            F.when(m.isNull(), F.lit("message is null"))
            .when(m["type"].isNull() | (F.length(F.trim(m["type"])) == 0), F.lit("type is empty"))
            .when(m["body"].isNull(), F.lit("body is null"))
            .when(
                m["destination"].isNull(),
                F.lit("destination is null and no default_destination is set"),
            )
            .when(
                ~m["destination"].rlike(_DESTINATION),
                F.concat(F.lit("destination '"), m["destination"], F.lit("' is not a valid name")),
            )
            .when(
                size > max_message_bytes,
                F.concat(
                    F.lit("body is "),
                    size.cast("string"),
                    F.lit(f" bytes; the limit is {max_message_bytes} (oversized)"),
                ),
            )
            .when(m["ordering_key"].isNotNull(), _id_problem(m["ordering_key"], "ordering_key"))
            .when(
                m["correlation_id"].isNotNull(), _id_problem(m["correlation_id"], "correlation_id")
            )
        )
        return F.when(problem.isNotNull(), F.concat(where, problem))

    per_message = F.filter(F.transform(F.col("messages"), message_problem), lambda p: p.isNotNull())
    return F.coalesce(
        _id_problem(F.col("id"), "id"),
        _id_problem(F.col("type"), "type"),
        F.when(
            F.col("state").isNotNull()
            & (
                F.try_parse_json(F.col("state")).isNull() | ~F.ltrim(F.col("state")).startswith("{")
            ),
            F.lit("state is not a JSON object"),
        ),
        F.when(F.col("_expected") < 0, F.lit("expected_version is negative")),
        F.get(per_message, 0),
    )


def check_rows(source: Any, *, max_message_bytes: int) -> Checked:
    """One Spark job over the normalised source; raises on the first bad row."""
    from pyspark.sql import functions as F

    problem = _row_problem(max_message_bytes)
    row = source.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count_distinct(F.col("id")).alias("ids"),
        F.sum(F.size("messages")).alias("messages"),
        F.collect_set("bucket").alias("buckets"),
        F.min_by(
            F.struct(F.col("id"), problem.alias("problem")), F.when(problem.isNotNull(), 0)
        ).alias("bad"),
    ).first()
    assert row is not None
    bad = row["bad"]
    if bad is not None and bad["problem"] is not None:
        text = f"changes row id={bad['id']!r}: {bad['problem']}"
        if "(oversized)" in bad["problem"]:
            raise MessageTooLargeError(
                text, hint="send a reference to the data instead, or raise max_message_bytes"
            )
        raise ValidationError(text, hint="nothing was written; fix the row and apply again")
    if int(row["ids"]) != int(row["rows"]):
        dup = source.groupBy("id").count().filter(F.col("count") > 1).select("id").first()
        raise ValidationError(
            f"changes name the document {dup['id'] if dup else '?'!r} more than once in one "
            "batch; nothing was written",
            hint="combine the changes of one document first (last state, messages in order)",
        )
    return Checked(int(row["rows"]), int(row["messages"] or 0), sorted(row["buckets"] or []))
