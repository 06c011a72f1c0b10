"""What a console serves and how (``ConsoleConfig``): its own module so the pages' modules
(``app``, ``trace_page``, ``keys_page``) share it without importing each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dispatcher.queue.sql_queue import SqlQueue
from outbox.app.history import History
from outbox.core.clock import Clock

if TYPE_CHECKING:
    from outbox.app.trace import Trace


@dataclass(frozen=True)
class ConsoleConfig:
    """What a console serves and how: its queue database, clock and token, and whether it may
    change anything."""

    queue: SqlQueue
    history: History
    clock: Clock
    token: str
    read_only: bool = False
    #: where it listens (for the trusted Host headers and the cookie's name)
    host: str = "127.0.0.1"
    port: int = 8765
    #: what the overview names as the workspace (redacted: no secret)
    table_uri: str = ""
    sql_url: str = ""
    devices_queue: str = "devices"
    secret_key: bytes | None = None
    #: ``outbox.app.trace.trace`` bound to the workspace's settings (the CLI builds it): the
    #: trace page reads the Delta table, which nothing else of the console needs
    trace: Callable[[str], Trace] | None = None
    #: Kafka dead-letter topics to show, and how to open one (the CLI builds it from the
    #: settings' Kafka configuration); none: no Kafka pages
    kafka_topics: tuple[str, ...] = ()
    kafka_dead_letters: Callable[[str], Any] | None = None
