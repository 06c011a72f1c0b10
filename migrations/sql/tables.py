"""The SQL schema as SQLAlchemy Core tables: the queue, its dead letters and duplicate-detection
ids, the rescuer's checkpoints, the consumer inbox, the claim log of two regions and the replays
from the table's history.

Code builds queries from these objects, and a new database is created from them at the head
revision (``migrations.sql.upgrade``); a database with a history gets the same tables from the
Alembic revisions. So they describe the head exactly, down to what ``compare_metadata`` does not
look at: column order (a column a revision added comes last, as ``ALTER TABLE .. ADD`` put it),
server defaults, SQLite's ``AUTOINCREMENT``; ``tests/queue/test_fresh_schema.py`` compares the
two databases in full. Times are stored timezone-aware (UTC) so SQLite and PostgreSQL
compare them the same way.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    false,
)

#: SQLite only auto-increments an ``INTEGER PRIMARY KEY``; PostgreSQL gets a 64-bit identity.
#: Both never hand out a number twice: SQLite through ``AUTOINCREMENT`` (``sqlite_autoincrement``
#: on the table, revision 0007), PostgreSQL's sequence by itself.
SequenceNumber = BigInteger().with_variant(Integer(), "sqlite")

NAME = 260  # Service Bus entity names are at most 260 characters
ID = 128  # message_id and session_id are at most 128 characters on Service Bus

metadata = MetaData()

queue_messages = Table(
    "outbox_queue_messages",
    metadata,
    Column("sequence_number", SequenceNumber, primary_key=True, autoincrement=True),
    Column("queue", String(NAME), nullable=False),
    Column("message_id", String(ID), nullable=False),
    Column("session_id", String(ID), nullable=True),
    Column("body", LargeBinary, nullable=False),
    Column("subject", String(256), nullable=False, default=""),
    Column("content_type", String(256), nullable=False, default=""),
    Column("correlation_id", String(ID), nullable=True),
    Column("headers", Text, nullable=False, default="{}"),
    Column("enqueued_at", DateTime(timezone=True), nullable=False),
    # Not delivered before this time: the scheduled time, or now + delay after an abandon.
    Column("not_before", DateTime(timezone=True), nullable=False),
    Column("delivery_count", Integer, nullable=False, default=0),
    Column("lock_token", String(36), nullable=True),
    Column("locked_until", DateTime(timezone=True), nullable=True),
    # Set aside by ``defer``: received only by sequence number (``receive_deferred``).
    Column("deferred", Boolean, nullable=False, default=False, server_default=false()),
    # Sent with a future ``not_before``: not in its session until that time (as on Service Bus);
    # an abandon's delay is not a schedule and keeps holding the session.
    Column("scheduled", Boolean, nullable=False, default=False, server_default=false()),
    # when the current (or last) lock was taken: a device gateway's "last try" (0005)
    Column("locked_at", DateTime(timezone=True), nullable=True),
    # The receive hot path scans one queue in sequence order.
    Index("ix_outbox_queue_messages_receive", "queue", "sequence_number"),
    # "Is there an earlier message in this session?" (session FIFO, one holder per session).
    Index("ix_outbox_queue_messages_session", "queue", "session_id", "sequence_number"),
    # Settling by a bare lock token.
    Index("ix_outbox_queue_messages_lock_token", "lock_token"),
    # SQLite: a deleted newest row's number never comes back (0007, migrations.sql.ids)
    sqlite_autoincrement=True,
)

dead_letters = Table(
    "outbox_queue_dead_letters",
    metadata,
    Column("id", SequenceNumber, primary_key=True, autoincrement=True),
    Column("queue", String(NAME), nullable=False),
    Column("message_id", String(ID), nullable=False),
    Column("session_id", String(ID), nullable=True),
    Column("body", LargeBinary, nullable=False),
    Column("subject", String(256), nullable=False, default=""),
    Column("content_type", String(256), nullable=False, default=""),
    Column("correlation_id", String(ID), nullable=True),
    Column("headers", Text, nullable=False, default="{}"),
    Column("enqueued_at", DateTime(timezone=True), nullable=False),
    Column("sequence_number", BigInteger, nullable=False),  # the original one, for reference
    Column("delivery_count", Integer, nullable=False),
    Column("reason", String(256), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("dead_lettered_at", DateTime(timezone=True), nullable=False),
    Index("ix_outbox_queue_dead_letters_queue", "queue", "id"),
    # the console's filters and device pages (0006)
    Index("ix_outbox_queue_dead_letters_reason", "reason", "id"),
    Index("ix_outbox_queue_dead_letters_queue_reason", "queue", "reason", "id"),
    Index("ix_outbox_queue_dead_letters_at", "dead_lettered_at", "id"),
    Index("ix_outbox_queue_dead_letters_queue_at", "queue", "dead_lettered_at", "id"),
    Index("ix_outbox_queue_dead_letters_session", "queue", "session_id", "id"),
    sqlite_autoincrement=True,  # as the messages' sequence numbers (0007)
)

duplicate_ids = Table(
    "outbox_queue_duplicate_ids",
    metadata,
    Column("queue", String(NAME), nullable=False),
    Column("message_id", String(ID), nullable=False),
    Column("seen_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("queue", "message_id", name="pk_outbox_queue_duplicate_ids"),
    Index("ix_outbox_queue_duplicate_ids_seen_at", "seen_at"),
)

checkpoints = Table(
    "outbox_checkpoints",
    metadata,
    Column("table_uri", String(1024), nullable=False),
    Column("rescuer_name", String(256), nullable=False),
    Column("version", BigInteger, nullable=True),
    Column("generation", BigInteger, nullable=False, default=0),  # compare-and-set guard
    Column("last_pass_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("details", Text, nullable=True),  # JSON text
    PrimaryKeyConstraint("table_uri", "rescuer_name", name="pk_outbox_checkpoints"),
)

# The consumer inbox (dispatcher.queue.inbox.SqlInbox): a row with handled_at is a handled
# message id (every row written before revision 0004 is one); a row without it is a claim of
# ``owner`` until ``lease_until`` (NULL: released), taken before the handler runs.
inbox = Table(
    "outbox_inbox",
    metadata,
    Column("consumer", String(NAME), nullable=False),
    Column("message_id", String(ID), nullable=False),
    Column("handled_at", DateTime(timezone=True), nullable=True),
    Column("owner", String(NAME), nullable=True),
    Column("lease_until", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("consumer", "message_id", name="pk_outbox_inbox"),
)

# The claim log of two regions (dispatcher.claims.sql): one row per claimed key, and a position
# counter per session so registered keys keep the order they were sent in.
CLAIM_KEY = 300  # a session id and a message id, with a separator

claims = Table(
    "outbox_claims",
    metadata,
    Column("claim_key", String(CLAIM_KEY), nullable=False),
    Column("session_id", String(ID), nullable=True),
    Column("position", BigInteger, nullable=True),
    Column("status", String(16), nullable=False),
    Column("owner", String(NAME), nullable=True),
    Column("lease_until", DateTime(timezone=True), nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("version", BigInteger, nullable=False),  # compare-and-set guard
    Column("updated_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("claim_key", name="pk_outbox_claims"),
    # "the earliest unfinished entry of this session before this position"
    Index("ix_outbox_claims_session", "session_id", "position"),
    Index("ix_outbox_claims_status", "status"),  # the console's claims in flight (0006)
)

claim_sessions = Table(
    "outbox_claim_sessions",
    metadata,
    Column("session_id", String(ID), nullable=False),
    Column("next_position", BigInteger, nullable=False),
    PrimaryKeyConstraint("session_id", name="pk_outbox_claim_sessions"),
)

# A session's state when it has one (0005): a paused session is left out of every receive (an
# offline device's tasks wait there without using up tries); no row means not paused.
queue_sessions = Table(
    "outbox_queue_sessions",
    metadata,
    Column("queue", String(NAME), nullable=False),
    Column("session_id", String(ID), nullable=False),
    Column("paused", Boolean, nullable=False, default=False, server_default=false()),
    Column("state", String(32), nullable=True),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("queue", "session_id", name="pk_outbox_queue_sessions"),
)

# The console's history (0006): one number per metric, subject (a rescuer's name, a queue) and
# sampling slot, recorded by the processes that already run; the slot's start is in the key, so
# two processes sampling the same slot write one row.
samples = Table(
    "outbox_samples",
    metadata,
    Column("metric", String(64), nullable=False),
    Column("subject", String(NAME), nullable=False),
    # the slot's start in seconds since the epoch: an integer, so a chart's buckets are one
    # integer division on SQLite and PostgreSQL alike
    Column("taken_at_s", BigInteger, nullable=False),
    Column("value", Float, nullable=False),
    Column("source", String(NAME), nullable=False),
    PrimaryKeyConstraint("metric", "subject", "taken_at_s", name="pk_outbox_samples"),
    # a chart's range of one metric, read from the index alone
    Index("ix_outbox_samples_range", "metric", "taken_at_s", "subject", "value"),
    Index("ix_outbox_samples_taken_at_s", "taken_at_s"),
)

# Paused ordering keys and their held lines (0008; dispatcher.queue.key_lines): a key with rows
# is paused, its row with the lowest id is the gate, and the ids are the line's order (never
# reused: AUTOINCREMENT on SQLite). Shared by every process that sends, so a key paused by a
# failed send in the writer holds the command worker's sends of that key too.
key_holds = Table(
    "outbox_key_holds",
    metadata,
    Column("id", SequenceNumber, primary_key=True, autoincrement=True),
    Column("destination", String(NAME), nullable=False),
    Column("ordering_key", String(ID), nullable=False),
    Column("doc_id", String(ID), nullable=False),
    Column("incarnation", String(64), nullable=True),
    Column("seq", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("message_id", String(ID), nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Index("ix_outbox_key_holds_key", "destination", "ordering_key", "id"),
    sqlite_autoincrement=True,
)

# Replays from the table's history (0009; outbox.app.replay): one row per ``outbox replay``, with
# its range, predicate and flags, the chunks planned and the cursor of those enqueued; a chunk's
# row is written by the worker that sent it (so a redelivered chunk is not sent twice and the
# progress is a count). A replay not finished holds the log trim at its range's start.
replays = Table(
    "outbox_replays",
    metadata,
    Column("replay_id", String(64), nullable=False),
    Column("table_id", String(64), nullable=False),
    Column("table_uri", String(1024), nullable=False),
    Column("from_version", BigInteger, nullable=False),
    Column("to_version", BigInteger, nullable=False),
    Column("predicate", Text, nullable=True),
    Column("destination", String(NAME), nullable=True),
    Column("new_ids", Boolean, nullable=False, default=False, server_default=false()),
    # planning -> enqueued -> done
    Column("status", String(16), nullable=False),
    Column("chunks", BigInteger, nullable=True),  # planned (None until the plan is made)
    Column("messages", BigInteger, nullable=True),
    Column("enqueued", BigInteger, nullable=False, default=0),  # the cursor: chunks enqueued
    Column("details", Text, nullable=True),  # JSON: the counts per destination and type
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("replay_id", name="pk_outbox_replays"),
)

replay_chunks = Table(
    "outbox_replay_chunks",
    metadata,
    Column("replay_id", String(64), nullable=False),
    Column("chunk", BigInteger, nullable=False),
    Column("messages", BigInteger, nullable=False),
    Column("sent_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("replay_id", "chunk", name="pk_outbox_replay_chunks"),
)

# Erasures (0010; outbox.app.erasure): one row per document being erased from a table. The id is
# the document's until the erasure is done, then ``sha256(table_id|id)`` (the ledger must not keep
# what it erased); ``erased_version`` is the table version of the erase commit, which the log trim
# must pass before the old files holding the rows may go.
erasures = Table(
    "outbox_erasures",
    metadata,
    Column("table_id", String(64), nullable=False),
    Column("doc_id", String(ID), nullable=False),
    Column("phase", String(16), nullable=False),  # requested -> erased -> done
    Column("erased_version", BigInteger, nullable=True),
    Column("requested_at", DateTime(timezone=True), nullable=False),
    Column("erased_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("table_id", "doc_id", name="pk_outbox_erasures"),
    Index("ix_outbox_erasures_phase", "table_id", "phase"),
)

# Named console operators (0011; outbox.app.operators): a token per name, kept as its SHA-256
# (the token itself is shown once, when it is made), with a role; a revoked one stays, dated.
console_tokens = Table(
    "outbox_console_tokens",
    metadata,
    Column("name", String(64), nullable=False),
    Column("role", String(16), nullable=False),  # "operator" or "read-only"
    Column("token_sha256", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("name", name="pk_outbox_console_tokens"),
    Index("ix_outbox_console_tokens_sha256", "token_sha256", unique=True),
)

# The audit trail (0011): one row per action on the queue's contents, newest by id.
audit = Table(
    "outbox_audit",
    metadata,
    Column("id", SequenceNumber, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", String(128), nullable=False),  # a token's name, "console" or "cli:<user>"
    Column("action", String(64), nullable=False),
    Column("target", Text, nullable=False),  # what it acted on: ids, a key, a name
    Column("outcome", String(512), nullable=False),
    sqlite_autoincrement=True,
)

# The rescuer's journal (0014; rescuer.journal): one row per ProcessDocument command a rescue
# pass enqueued, so the trace can say the rescuer touched a document after the command is gone.
rescues = Table(
    "outbox_rescues",
    metadata,
    Column("id", SequenceNumber, primary_key=True, autoincrement=True),
    Column("table_id", String(64), nullable=False),
    Column("doc_id", String(ID), nullable=False),
    Column("up_to_seq", BigInteger, nullable=False),
    Column("command_id", String(ID), nullable=False),
    Column("rescuer", String(128), nullable=False),  # the pass's rescuer_name
    Column("engine", String(32), nullable=False),
    Column("mode", String(16), nullable=False),  # feed or sweep
    Column("window_end", BigInteger, nullable=True),  # the last version the pass read
    Column("at", DateTime(timezone=True), nullable=False),
    Index("ix_outbox_rescues_doc", "table_id", "doc_id", "id"),
    Index("ix_outbox_rescues_at", "at"),
    sqlite_autoincrement=True,
)

# Which commits touched which documents (0012, 0013; outbox.app.trace.index): the trace's index,
# built from the Delta log and the files each commit wrote, so a document's history is read from
# here instead of the whole retained change data feed: a row per change row (the commit, the
# document's version and sequence numbers, the ids of the messages it carries) and each message
# once per document (what its fate needs). A derived cache: rows below the table's oldest
# retained commit are pruned, and dropping every row only costs a rebuild.
commit_index = Table(
    "outbox_commit_index",
    metadata,
    Column("table_id", String(64), nullable=False),
    Column("document_id", String(ID), nullable=False),
    Column("table_version", BigInteger, nullable=False),
    Column("row_no", Integer, nullable=False),  # its order among the document's rows there
    Column("change", String(32), nullable=False),  # the feed's _change_type
    Column("document_version", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("dispatched_seq", BigInteger, nullable=False),
    Column("messages", Text, nullable=True),  # a JSON list of message ids; null: none shown
    PrimaryKeyConstraint(
        "table_id", "document_id", "table_version", "row_no", name="pk_outbox_commit_index"
    ),
    Index("ix_outbox_commit_index_version", "table_id", "table_version"),
)
commit_index_messages = Table(
    "outbox_commit_index_messages",
    metadata,
    Column("table_id", String(64), nullable=False),
    Column("document_id", String(ID), nullable=False),
    Column("message_id", String(ID), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("destination", String(NAME), nullable=False),
    Column("type", String(256), nullable=False),
    Column("session_id", String(ID), nullable=False),
    Column("correlation_id", String(ID), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=True),
    Column("last_version", BigInteger, nullable=False),  # the newest commit carrying it
    PrimaryKeyConstraint(
        "table_id", "document_id", "message_id", name="pk_outbox_commit_index_messages"
    ),
    Index("ix_outbox_commit_index_messages_id", "table_id", "message_id"),
    Index("ix_outbox_commit_index_messages_correlation", "table_id", "correlation_id"),
    Index("ix_outbox_commit_index_messages_last", "table_id", "last_version"),
)
commit_index_cursor = Table(
    "outbox_commit_index_cursor",
    metadata,
    Column("table_id", String(64), nullable=False),
    Column("indexed_to", BigInteger, nullable=False),  # every commit up to it is in the index
    Column("updated_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("table_id", name="pk_outbox_commit_index_cursor"),
)
