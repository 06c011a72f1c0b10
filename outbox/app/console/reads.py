"""What the console's pages read, each a handful of indexed queries on the queue's database.

Why the overview reads samples for the table's numbers: counting the pending documents scans the
pending rows of the Delta table (145 ms at 1,000,000 documents, docs/delta.md; far more on an
object store), too slow for a page that must answer within 200 ms. The processes that already run
sample them (``outbox.app.sampling``); the page reads the newest sample and says how old it is.
What lives in the queue's database (queue depths, devices online) is read live.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dispatcher.mqtt.devices import presence_counts
from dispatcher.queue.messages import QueueStats
from dispatcher.queue.sql_queue import SqlQueue
from outbox.app import history as H
from outbox.app.console.chart import Chart, line_chart
from outbox.app.history import History, Point

#: The chart's ranges, by the name in ``?range=``.
RANGES = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(days=1),
          "7d": timedelta(days=7)}  # fmt: skip
DEFAULT_RANGE = "6h"


@dataclass
class Overview:
    now: datetime
    range_name: str
    pending_documents: Point | None
    pending_messages: Point | None
    oldest_pending_age: Point | None
    geo_claims_in_flight: Point | None
    #: rescuer name -> newest lag in seconds and in versions
    lags: dict[str, tuple[Point, Point | None]]
    chart: Chart | None
    queues: list[QueueStats]
    devices: dict[str, dict[str, int]]
    problems: list[str] = field(default_factory=list)

    @property
    def sampled_at(self) -> datetime | None:
        """When the table's numbers were sampled (None: never)."""
        return self.pending_documents.at if self.pending_documents else None


def overview(queue: SqlQueue, history: History, *, now: datetime, range_name: str) -> Overview:
    span = RANGES.get(range_name, RANGES[DEFAULT_RANGE])
    latest = history.latest(
        now=now,
        metrics=[
            H.PENDING_DOCUMENTS,
            H.PENDING_MESSAGES,
            H.OLDEST_PENDING_AGE,
            H.GEO_CLAIMS_IN_FLIGHT,
            H.RESCUE_LAG_SECONDS,
            H.RESCUE_LAG_VERSIONS,
        ],
    )
    pending = latest.get((H.PENDING_DOCUMENTS, ""))
    oldest = latest.get((H.OLDEST_PENDING_AGE, ""))
    if oldest is not None and pending is not None and oldest.at < pending.at:
        oldest = None  # nothing was pending at the newest sample
    lags = {
        subject: (point, latest.get((H.RESCUE_LAG_VERSIONS, subject)))
        for (metric, subject), point in sorted(latest.items())
        if metric == H.RESCUE_LAG_SECONDS
    }
    series = history.series(H.RESCUE_LAG_SECONDS, since=now - span, until=now)
    chart = line_chart(series, start=now - span, end=now) if series else None
    return Overview(
        now=now,
        range_name=range_name if range_name in RANGES else DEFAULT_RANGE,
        pending_documents=pending,
        pending_messages=latest.get((H.PENDING_MESSAGES, "")),
        oldest_pending_age=oldest,
        geo_claims_in_flight=latest.get((H.GEO_CLAIMS_IN_FLIGHT, "")),
        lags=lags,
        chart=chart,
        queues=list(queue.admin.stats().values()),
        devices=presence_counts(queue),
    )


#: At most this much of a body is shown (the rest is cut, and the page says so).
BODY_SHOWN = 64 * 1024


@dataclass(frozen=True)
class ShownBody:
    text: str
    kind: str  # "json", "text" or "binary (hex)"
    size: int
    cut: bool


def show_body(body: bytes) -> ShownBody:
    """A body as people read it: JSON indented, text as is, anything else in hex."""
    head = body[:BODY_SHOWN]
    cut = len(body) > BODY_SHOWN
    try:
        # A cut may fall inside a character: not final, the decoder leaves its first bytes out
        # instead of calling the whole body binary. A bad byte anywhere else still raises.
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=not cut)
    except UnicodeDecodeError:
        return ShownBody(head[:4096].hex(" ", 2), "binary (hex)", len(body), len(body) > 4096)
    if not cut:
        try:
            return ShownBody(_json(json.loads(text)), "json", len(body), False)
        except ValueError:
            pass
    return ShownBody(text, "text", len(body), cut)


def pretty(value: Any) -> str:
    return _json(value, sort_keys=True, default=str)


def _json(value: Any, **options: Any) -> str:
    """Indented JSON with its characters as they are (``ë``, not ``\\u00eb``). A lone surrogate
    (``"\\ud800"`` is valid JSON) cannot be sent as UTF-8: then the escaped form."""
    text = json.dumps(value, indent=2, ensure_ascii=False, **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, indent=2, **options)
    return text
