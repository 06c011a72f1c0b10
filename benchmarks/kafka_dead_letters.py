"""The console's Kafka dead-letter pages on a large dead-letter topic (issue 46, item 3 and its
numbers: every page within 200 ms p95 at 100,000 dead letters).

    python -m benchmarks.kafka_dead_letters            # 100,000 records, 8 partitions
    python -m benchmarks.kafka_dead_letters --quick    # 10,000 records
    python -m benchmarks.kafka_dead_letters --smoke    # 200 records, 2 timed requests a page

A dead-letter topic of ``--records`` records (the consumer helper's headers, spread over
``--partitions`` partitions) on a throwaway one-node broker (``testkit.kafka``, or the cluster
at ``--bootstrap``), and ``outbox console --kafka-dead-letters`` serving it on 127.0.0.1
(``benchmarks.console``'s client: one keep-alive connection a page, its session unlocked for
the POST). Each page is timed over HTTP beside its floor, the page's reads called directly
(``KafkaDeadLetters.page``, ``get_dead_letter``, ``by_ids``), alternating. Beside them, the read
every page made before (the whole topic, ``list_dead_letters``), timed a few times. A full run
writes ``benchmarks/results/kafka_dead_letters.json``; ``--quick`` and ``--smoke`` write into a
fresh temporary folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, percentile, save, summarize_ms

GOAL_MS = 200.0
PAGE = 50


def fill(bootstrap: str, records: int, partitions: int) -> str:
    """A dead-letter topic of ``records`` records, round-robin over its partitions."""
    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    from dispatcher.kafka.config import KafkaConfig
    from dispatcher.kafka.consumer import DLT_ERROR, DLT_REASON, DLT_TOPIC, DLT_TRIES
    from dispatcher.kafka.mapping import headers_of
    from dispatcher.transports.base import TransportMessage

    topic = f"orders-{uuid.uuid4().hex[:8]}.dlt"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for done in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        done.result(60)
    producer = confluent_kafka.Producer(KafkaConfig(bootstrap).producer())
    for i in range(records):
        m = TransportMessage(
            message_id=f"m-{i}", destination=topic, body=b'{"order": %d}' % i,
            session_id=f"cust-{i % 1000}",
            headers={DLT_TOPIC: "orders", DLT_REASON: "Poison" if i % 3 else "Timeout",
                     DLT_TRIES: "3", DLT_ERROR: f"ValueError: bad order {i}"},
        )  # fmt: skip
        while True:
            try:
                producer.produce(topic, m.body, partition=i % partitions, headers=headers_of(m))
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.1)
    if producer.flush(120):
        raise RuntimeError("the dead-letter records were not all delivered")
    return topic


@contextlib.contextmanager
def serve(root: Path, bootstrap: str, topic: str) -> Iterator[int]:
    """The console with the topic, as ``outbox console --kafka-dead-letters`` builds it."""
    from werkzeug.serving import make_server

    from benchmarks.console import TOKEN
    from dispatcher.kafka.config import KafkaConfig
    from dispatcher.kafka.dead_letters import KafkaDeadLetters
    from dispatcher.queue.sql_queue import SqlQueue
    from migrations.sql import upgrade
    from outbox.app.console import ConsoleConfig, create_app
    from outbox.app.history import History
    from outbox.core.clock import SystemClock

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    url = f"sqlite:///{root / 'outbox.db'}"
    upgrade(url)
    config = KafkaConfig(bootstrap)
    with SqlQueue(url) as queue:
        app = create_app(
            ConsoleConfig(
                queue=queue, history=History(queue.database), clock=SystemClock(), token=TOKEN,
                kafka_topics=(topic,),
                kafka_dead_letters=lambda name: KafkaDeadLetters(config, name),
            )
        )  # fmt: skip
        server = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, name="console-http", daemon=True)
        thread.start()
        try:
            yield server.server_port
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


def measure(port: int, bootstrap: str, topic: str, timed: int) -> list[dict[str, Any]]:
    from urllib.parse import urlencode

    from benchmarks.console import Page, measure_page
    from dispatcher.kafka.config import KafkaConfig
    from dispatcher.kafka.dead_letters import KafkaDeadLetters

    def letters() -> KafkaDeadLetters:
        return KafkaDeadLetters(KafkaConfig(bootstrap), topic)  # a new one each request

    first, total, _ = letters().page(None, PAGE)
    middle = sorted(d.id for d in letters().by_ids([first[-1].id]))[0] - total // 2
    ids = [d.id for d in first]
    form: dict[str, Any] = {"topic": topic, "id": [str(i) for i in ids]}
    pages: list[Page] = [
        Page("kafka_list", "the list, first page", f"/kafka?{urlencode({'topic': topic})}",
             lambda: letters().page(None, PAGE)),
        Page("kafka_list_middle", "the list, a page in the middle",
             f"/kafka?{urlencode({'topic': topic, 'before': middle})}",
             lambda: letters().page(middle, PAGE)),
        Page("kafka_show", "one dead letter",
             f"/kafka/show?{urlencode({'topic': topic, 'id': ids[7]})}",
             lambda: letters().get_dead_letter(ids[7])),
        Page("kafka_confirm", f"the requeue confirmation of {len(ids)} ticked", "/kafka/confirm",
             lambda: letters().by_ids(ids), form=form),
    ]  # fmt: skip
    sizes = _Sizes(warmup=2, timed=timed)
    out = []
    for page in pages:
        r = measure_page(port, page, sizes)  # type: ignore[arg-type]
        out.append(r)
        print(f"  {page.name:<20} p50 {r['p50_ms']:>8.1f}  p95 {r['p95_ms']:>8.1f}  "
              f"floor p50 {r['floor']['p50_ms']:>8.1f}")  # fmt: skip
    return out


class _Sizes:
    """What ``benchmarks.console.measure_page`` reads of its sizes."""

    def __init__(self, warmup: int, timed: int) -> None:
        self.warmup = warmup
        self.timed = timed


def whole_topic(bootstrap: str, topic: str, repeat: int) -> dict[str, float]:
    """What each page read before: every record of the topic."""
    from dispatcher.kafka.config import KafkaConfig
    from dispatcher.kafka.dead_letters import KafkaDeadLetters

    took = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        KafkaDeadLetters(KafkaConfig(bootstrap), topic).list_dead_letters(limit=10**9)
        took.append(time.perf_counter() - t0)
    return summarize_ms(took)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10,000 records")
    parser.add_argument("--records", type=int)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, help="timed requests a page (default 20)")
    parser.add_argument("--bootstrap", help="an existing cluster instead of a throwaway broker")
    add_output_options(parser)
    args = parser.parse_args(argv)
    records = args.records or (200 if args.smoke else 10_000 if args.quick else 100_000)
    repeat = args.repeat or (2 if args.smoke else 20)
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from testkit.kafka import KafkaBroker

            broker = KafkaBroker(heap="1g", quick_start=args.smoke)
            bootstrap = broker.start()
            stack.callback(broker.stop)
        started = time.perf_counter()
        topic = fill(bootstrap, records, args.partitions)
        fill_s = time.perf_counter() - started
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="outbox-kdl-")))
        with serve(root, bootstrap, topic) as port:
            pages = measure(port, bootstrap, topic, repeat)
        before = whole_topic(bootstrap, topic, 2 if args.smoke else 3)
    data = {
        "records": records,
        "partitions": args.partitions,
        "page_size": PAGE,
        "fill_s": round(fill_s, 1),
        "pages": pages,
        "whole_topic_read": before,
        "goal_ms": GOAL_MS,
        "within_200ms": all(p["within_200ms"] for p in pages),
        "broker": "Apache Kafka, one KRaft node on 127.0.0.1" if not args.bootstrap else "given",
    }
    worst = max(percentile([p["p95_ms"] for p in pages], 100), 0.0)
    path = save(args, "kafka_dead_letters", data)
    print(f"worst page p95 {worst:.1f} ms; the whole topic read p50 {before['p50_ms']:.1f} ms "
          f"-> {path}")  # fmt: skip


if __name__ == "__main__":
    main()
