"""Kafka transport benchmark: commit to acknowledged, against a raw producer in the same run.

    python -m benchmarks.kafka            # 1,000 documents per unit of work x 20 rounds
    python -m benchmarks.kafka --quick    # 1,000 x 5
    python -m benchmarks.kafka --smoke    # 10 x 2, no warm-up run

Both sides talk to the same throwaway one-node broker (``testkit.kafka``, 127.0.0.1; or
the cluster at ``--bootstrap``), to a fresh 8-partition topic each, one message per document:

* ``outbox``: ``Outbox.open(transport="kafka")``, each round one unit of work of ``--docs``
  documents with one message each; ``messages_per_second`` is messages / the summed
  commit-returned -> every record acknowledged (the dispatch time the metrics record, ending
  when the marks are handed to the watermark writer); the watermark MERGEs run after the acks,
  off the caller's path, and ``with_final_watermark_flush_per_second`` adds the flush of those
  still waiting at the end (as benchmarks/dispatch.py counts it);
* ``raw``: a ``confluent_kafka.Producer`` with the transport's own properties (idempotent,
  ``acks=all``) producing the same records (key, value, the same five headers, encoded in the
  timing as any producer must) from messages built before the timing (as the outbox's rows are
  before its dispatch), in batches of the dispatcher's send size, waiting for every delivery
  report of a batch before the next, as the transport does: the same sends without the outbox.

``transport_alone`` sends the raw side's prebuilt messages through ``KafkaTransport.send``
instead: the transport's own cost over the raw producer (``transport_alone_ratio``).

``ratio`` is outbox / raw (goal at least 0.8). ``memory_transport`` runs the outbox's loop on
the in-memory transport: the dispatcher's own time per message, which the outbox adds to the
raw sends (``per_1000_messages`` sets the three side by side). Each outbox run also keeps
every round's time (``round_dispatch_ms``: two slow rounds were half a mean once) and the
collector's pauses during its rounds (``gc``, as benchmarks/dispatcher_cost.py). The broker
runs with its full JIT and is warmed by a discarded raw run first. A full run writes
``benchmarks/results/kafka.json``; ``--quick`` and ``--smoke`` write into a fresh temporary
folder, never into benchmarks/results/ (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, save, summarize_ms
from benchmarks.dispatcher_cost import GcPauses
from dispatcher.kafka.config import KafkaConfig
from dispatcher.kafka.mapping import headers_of
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.transports.base import TransportMessage
from outbox.app.facade import Outbox
from testkit.kafka import KafkaBroker

PARTITIONS = 8
SEND_SIZE = 1000  # the dispatcher's largest send (Dispatcher.max_batch)


def _topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    name = f"bench-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(60)
    return name


def run_outbox(
    root: Path, bootstrap: str, docs: int, rounds: int, *, transport: str = "kafka"
) -> dict[str, Any]:
    topic = _topic(bootstrap)
    ws = Path(tempfile.mkdtemp(prefix=f"ws-{transport}-", dir=root))
    gc.collect()
    with Outbox.open(
        ws, transport=transport, kafka_bootstrap_servers=bootstrap, default_destination=topic
    ) as ob:
        runtime = ob.runtime
        with ob.unit_of_work() as uow:  # warm up: table, producer connection, metadata
            uow.create("warm-up", type="Shipment").send("Created", {"i": 0})
        if runtime.watermarks is not None:
            assert runtime.watermarks.flush(60)
        runtime.metrics.reset()
        pauses = GcPauses()
        gc.callbacks.append(pauses)
        pauses.on = True  # the whole loop: the saves' collections fall on the dispatch too
        try:
            for r in range(rounds):
                with ob.unit_of_work() as uow:
                    for i in range(docs):
                        doc = uow.create(f"r{r}-d{i}", type="Shipment", state={"status": "created"})
                        doc.send("StatusChanged", {"status": "left Seattle", "i": i})
        finally:
            gc.callbacks.remove(pauses)
        flush = 0.0
        if runtime.watermarks is not None:
            t0 = time.perf_counter()
            assert runtime.watermarks.flush(600), runtime.watermarks.last_error
            flush = time.perf_counter() - t0
        m = runtime.metrics
        assert m["messages_sent"] == docs * rounds, m.snapshot()
        assert ob.store.scan_pending().num_rows == 0, "dispatch left documents pending"
        dispatch_s = list(m.dispatch_latency)
        return {
            "messages": docs * rounds,
            # commit returned -> every record acknowledged (the marks handed to the writer)
            "messages_per_second": round(docs * rounds / sum(dispatch_s), 1),
            # ... plus the deferred watermark MERGEs still waiting at the end (off the path)
            "with_final_watermark_flush_per_second": round(
                docs * rounds / (sum(dispatch_s) + flush), 1
            ),
            "final_watermark_flush_ms": round(flush * 1000, 2),
            "dispatch_ms": summarize_ms(dispatch_s),
            # each round's commit -> acknowledged: an outlier round is much of a mean
            "round_dispatch_ms": [round(s * 1000, 2) for s in dispatch_s],
            "gc": pauses.summary(),
            "settle": summarize_ms(list(m.settle_latency)),
            "send_calls": m["send_calls"],
        }


def run_raw(bootstrap: str, docs: int, rounds: int, *, transport: bool = False) -> dict[str, Any]:
    """The raw producer; with ``transport``, the same sends through ``KafkaTransport.send``."""
    import confluent_kafka

    topic = _topic(bootstrap)
    producer = confluent_kafka.Producer(KafkaConfig(bootstrap).producer())
    kafka_transport = KafkaTransport(KafkaConfig(bootstrap)) if transport else None
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    def messages(r: int) -> list[TransportMessage]:
        out = []
        for i in range(docs):
            m = TransportMessage(
                message_id=uuid.uuid4().hex,
                destination=topic,
                body=b'{"status":"left Seattle","i":%d}' % i,
                subject="StatusChanged",
                session_id=f"r{r}-d{i}",
                correlation_id=uuid.uuid4().hex,
                headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
            )
            out.append(m)
        return out

    producer.produce(topic, value=b"warm-up", on_delivery=report)
    producer.flush(30)
    if kafka_transport is not None:
        kafka_transport.send(messages(-1)[:1])
    rounds_s = []
    for r in range(rounds):
        batch = messages(r)  # built outside the timing: the outbox's rows exist before dispatch
        t0 = time.perf_counter()
        for start in range(0, len(batch), SEND_SIZE):
            if kafka_transport is not None:
                kafka_transport.send(batch[start : start + SEND_SIZE])
                continue
            for m in batch[start : start + SEND_SIZE]:  # any producer encodes key and headers
                producer.produce(
                    topic,
                    value=m.body,
                    key=m.session_id.encode(),  # type: ignore[union-attr]
                    headers=headers_of(m),
                    on_delivery=report,
                )
            producer.flush(60)
        rounds_s.append(time.perf_counter() - t0)
    assert not errors, errors[:3]
    if kafka_transport is not None:
        kafka_transport.close()
    return {
        "messages": docs * rounds,
        "messages_per_second": round(docs * rounds / sum(rounds_s), 1),
        "round_ms": summarize_ms(rounds_s),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--docs", type=int, help="documents per unit of work (default 1000)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--bootstrap", help="an existing cluster instead of a throwaway broker")
    add_output_options(parser)
    args = parser.parse_args(argv)
    docs = args.docs or (10 if args.smoke else 1000)
    rounds = args.rounds or (2 if args.smoke else 5 if args.quick else 20)
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = KafkaBroker(heap="1g", quick_start=args.smoke)
        bootstrap = broker.start()
    root = Path(tempfile.mkdtemp(prefix="outbox-bench-kafka-"))
    pairs = 1 if args.smoke else 3
    try:
        if not args.smoke:  # a smoke run measures nothing: no warm-up
            run_raw(bootstrap, docs, rounds)  # warm-up: the broker's JIT, not measured
        # raw, outbox, raw, outbox...: each side's best, so a slow moment of the machine falls
        # on both sides alike
        raws, outs, alone = [], [], []
        for _ in range(pairs):
            raws.append(run_raw(bootstrap, docs, rounds))
            outs.append(run_outbox(root, bootstrap, docs, rounds))
            alone.append(run_raw(bootstrap, docs, rounds, transport=True))
        # the dispatcher's own work: the same loop on the in-memory transport
        own = run_outbox(root, bootstrap, docs, rounds, transport="memory")
    finally:
        if broker is not None:
            broker.cleanup()
    raw = max(raws, key=lambda c: c["messages_per_second"])
    out = max(outs, key=lambda c: c["messages_per_second"])
    ratio = round(out["messages_per_second"] / raw["messages_per_second"], 3)
    transport_alone = max(alone, key=lambda c: c["messages_per_second"])
    per_1000 = {
        "outbox_ms": round(1e6 / out["messages_per_second"], 2),
        "raw_ms": round(1e6 / raw["messages_per_second"], 2),
        "transport_alone_ms": round(1e6 / transport_alone["messages_per_second"], 2),
        "dispatcher_own_ms": round(1e6 / own["messages_per_second"], 2),
    }
    data = {
        "docs_per_unit_of_work": docs,
        "rounds": rounds,
        "partitions": PARTITIONS,
        "broker": "Apache Kafka 4.4.0, one KRaft node on 127.0.0.1" if broker else bootstrap,
        "outbox": out,
        "raw": raw,
        "runs": {"outbox": outs, "raw": raws, "transport_alone": alone},
        "transport_alone": transport_alone,
        "transport_alone_ratio": round(
            transport_alone["messages_per_second"] / raw["messages_per_second"], 3
        ),
        "memory_transport": own,
        "per_1000_messages": per_1000,
        "ratio": ratio,
        "goal_ratio": 0.8,
        "meets_goal": ratio >= 0.8,
    }
    path = save(args, "kafka", data)
    print(
        f"outbox {out['messages_per_second']:,.0f} msg/s, raw {raw['messages_per_second']:,.0f} "
        f"msg/s: {ratio:.2f}x; the transport alone {data['transport_alone_ratio']:.2f}x; "
        f"per 1,000 messages {per_1000} -> {path}"
    )


if __name__ == "__main__":
    main()
