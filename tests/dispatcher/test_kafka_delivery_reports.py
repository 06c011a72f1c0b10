"""``KafkaTransport.send`` returns only once every record of its batch has its delivery report,
whichever thread's poll served it (issue 45: a send's reports are counted without a lock, and
overlapping sends poll for each other's). No broker: a producer that delivers late, one report
per poll, only from ``poll`` (as librdkafka calls delivery callbacks), with two sends polling at
once."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from dispatcher.kafka.mapping import MESSAGE_ID
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.transports.base import TransportMessage
from tests.dispatcher.test_key_order import HANG


class _Record:
    def __init__(self, headers: list[tuple[str, bytes]]) -> None:
        self._headers = headers

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers


class LateProducer:
    """Queues each record's report at produce; each ``poll`` serves at most one, on the polling
    thread, waiting up to its timeout for one to be ready."""

    def __init__(self) -> None:
        self._ready: deque[tuple[Callable[[Any, Any], None], _Record]] = deque()
        self._cond = threading.Condition()
        self.reported: set[str] = set()

    def produce(
        self, topic: str, *, value: bytes, key: Any, headers: Any, on_delivery: Any
    ) -> None:
        with self._cond:
            self._ready.append((on_delivery, _Record(headers)))
            self._cond.notify_all()

    def poll(self, timeout: float) -> int:
        with self._cond:
            if not self._ready:
                self._cond.wait(timeout)
            if not self._ready:
                return 0
            callback, record = self._ready.popleft()
        mid = dict(record.headers())[MESSAGE_ID].decode()
        self.reported.add(mid)
        callback(None, record)
        return 1

    def flush(self, timeout: float) -> int:
        return 0


def _batch(prefix: str, n: int) -> list[TransportMessage]:
    return [TransportMessage(f"{prefix}{i}", "t", b"{}", session_id=prefix) for i in range(n)]


def test_a_send_returns_after_every_report_of_its_batch_whoever_polled_it() -> None:
    producer = LateProducer()
    t = KafkaTransport("127.0.0.1:1", producer=producer)
    t._topics.add("t")  # known: no metadata request to the stub
    batches = {name: _batch(name, 200) for name in ("one", "two")}
    missing: dict[str, set[str]] = {}
    errors: list[BaseException] = []

    def send(name: str) -> None:
        try:
            t.send(batches[name])
            missing[name] = {m.message_id for m in batches[name]} - producer.reported
        except BaseException as e:  # reported below, not lost on the thread
            errors.append(e)

    threads = [threading.Thread(target=send, args=(n,), name=n) for n in batches]
    for th in threads:
        th.start()
    for th in threads:
        th.join(HANG)
    assert not errors
    assert missing == {"one": set(), "two": set()}
