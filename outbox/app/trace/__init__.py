"""``outbox trace ID``: what happened to a document (issue 46, item 1). ``timeline`` finds the
document and reads its history, ``fates`` looks for its messages and commands in the SQL queue,
``model`` is the answer's shape."""

from outbox.app.trace.model import (
    CommandSeen,
    Commit,
    DeadLettered,
    DocumentTrace,
    MessageFate,
    QueuedCopy,
    Trace,
)
from outbox.app.trace.timeline import trace, writer_of

__all__ = [
    "CommandSeen",
    "Commit",
    "DeadLettered",
    "DocumentTrace",
    "MessageFate",
    "QueuedCopy",
    "Trace",
    "trace",
    "writer_of",
]
