"""One maintainer of a table at a time, across machines: the maintenance lease.

Why: deltalake 1.6.6 lets two concurrent compactions of one snapshot both commit (both removals
are data-neutral, and its conflict checker lets those pass), and every compacted row then exists
twice (docs/delta.md, "Two concurrent compactions"). On a local disk a file lock beside the log
keeps a second compactor out; an object store has no such lock, and measured on Azurite and S3,
two ``outbox maintain`` started together duplicated rows five times out of five (issue 32).

How: a claim in the SQL database the deployment already shares (the queue's, the rescuer's
checkpoints'), taken before compacting or repairing a table and renewed while the work runs. It
is a row of the consumer inbox table (``outbox_inbox``, consumer ``outbox.maintenance``, the
table id as the message id): that table's claim is exactly a lease (one atomic
``INSERT .. ON CONFLICT DO UPDATE .. WHERE free``, taken over once it expires, renewed by its
owner), so no new table and no migration. A maintainer that dies leaves a claim that expires
after ``LEASE``; a second maintainer meanwhile skips the work and says who holds it.

What it does not cover: a maintainer configured with another SQL database than the first (two
databases, two leases); every process of a deployment shares one ``sql_url``
(docs/object-storage.md).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from outbox.core.clock import Clock

log = logging.getLogger("outbox.maintain")

CONSUMER = "outbox.maintenance"
#: How long a claim lasts without renewal; renewed every half of it while the work runs.
LEASE = timedelta(minutes=5)


def owner_name() -> str:
    """This process, recognisably: host, pid and a random suffix (a restarted pid differs)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@contextmanager
def maintenance_lease(
    sql_url: str, table_id: str, *, clock: Clock, lease: timedelta = LEASE
) -> Iterator[str | None]:
    """Hold the maintenance lease of ``table_id`` for the ``with`` block: yields None when this
    process holds it, else a line naming the holder (the caller then skips its work)."""
    from dispatcher.queue.database import Database, open_engine
    from dispatcher.queue.inbox import ClaimKeeper, SqlInbox

    engine = open_engine(sql_url)
    database = Database(engine, owned=True)
    me = owner_name()
    try:
        keeper = ClaimKeeper(SqlInbox(database, CONSUMER), clock, lease, check_interval=5.0)
        claim = keeper.take(table_id, me)
        if not claim.won:
            until = claim.lease_until.isoformat() if claim.lease_until else "?"
            yield f"another maintainer holds the table ({claim.owner}, until {until})"
            return
        log.info("maintenance lease of table %s taken by %s", table_id, me)
        try:
            with keeper.renewing():
                yield None
        finally:
            keeper.release(table_id, me)
    finally:
        engine.dispose()
