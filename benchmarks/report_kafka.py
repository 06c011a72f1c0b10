"""The Kafka results blocks (``benchmarks/results/kafka.json`` and ``spark_kafka.json``, issue
33), for ``benchmarks.report``."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table


def _kafka_rows(k: dict[str, Any]) -> list[list[str]]:
    p = k["per_1000_messages"]
    return [
        [
            f"the outbox on Kafka (one broker on 127.0.0.1), {n(k['docs_per_unit_of_work'])} "
            "documents per unit of work, commit → every record acknowledged / a raw "
            "confluent-kafka producer doing the same sends / `KafkaTransport.send` alone on "
            "them, best of 3 each, same run",
            f"{n(k['outbox']['messages_per_second'])} / {n(k['raw']['messages_per_second'])} / "
            f"{n(k['transport_alone']['messages_per_second'])} msg/s: **{n(k['ratio'], 2)}×** "
            f"raw (goal 0.8×), the transport alone {n(k['transport_alone_ratio'], 2)}×; per "
            f"1,000 messages {n(p['outbox_ms'], 1)} = raw {n(p['raw_ms'], 1)} + the "
            f"dispatcher's own {n(p['dispatcher_own_ms'], 1)} ms (the in-memory transport)",
            "`kafka.json`",
        ]
    ]


def _spark_rows(s: dict[str, Any]) -> list[list[str]]:
    runs = s["runs"]
    cores = [k for k in ("local[1]", "local[2]") if k in runs]
    rates = " / ".join(f"{n(runs[c]['messages_per_second'])}" for c in cores)
    sends = " / ".join(f"{n(runs[c]['timings_s']['executor_send_s'], 1)}" for c in cores)
    return [
        [
            f"Spark apply of {n(s['messages'])} messages sent to Kafka from the executors, "
            f"{' / '.join(cores)}, commit → settled",
            f"{rates} msg/s (executors' job {sends} s, marks append "
            f"{n(runs[cores[-1]]['timings_s']['watermark_s'], 1)} s): "
            f"**{n(s['over_before'], 2)}×** the driver's figure before "
            f"({n(s['before_spark_write_messages_per_second'])} msg/s, goal 2×), "
            f"{n(s['over_python_path'], 2)}× the Python path on the same broker "
            f"({n(s['python_path']['messages_per_second'])} msg/s at "
            f"{n(s['python_path']['messages'])} documents per unit of work)",
            "`spark_kafka.json`",
        ]
    ]


def readme_rows() -> list[list[str]]:
    """The README performance table's lines for Kafka and Spark on Kafka."""
    return _kafka_rows(load("kafka")) + _spark_rows(load("spark_kafka"))


def kafka() -> str:
    return table(["what", "figure", "source"], readme_rows())


RENDERERS = {"kafka": kafka}
