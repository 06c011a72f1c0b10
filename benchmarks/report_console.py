"""The console's results block (``benchmarks/results/console.json``), for ``benchmarks.report``:
each page's time over HTTP beside its floor, the sizes it was measured at, and what a console
sample costs the processes that take it."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table


def _ms(value: float) -> str:
    return f"{n(value, 1)} ms"


def _caption(c: dict[str, Any]) -> str:
    s, r = c["sizes"], c["requests"]
    return (
        f"{n(s['documents'])} documents ({n(s['pending_documents'])} pending), "
        f"{n(s['dead_letters'])} dead letters ({s['dead_letter_queues']} queues, "
        f"{s['dead_letter_reasons']} reasons, {s['dead_letter_days']} days, "
        f"{n(s['dead_letter_body_bytes'])}-byte bodies), {n(s['devices'])} devices × "
        f"{s['tasks_per_device']} tasks, {n(s.get('live_messages', 0))} live messages in one "
        f"queue, {n(s.get('paused_keys', 0))} paused keys, {n(s['sample_rows'])} samples "
        f"({n(s['sample_days'])} "
        f"days of {s['rescuers']} rescuers); {c['database']}; {r['timed']} timed requests per "
        f"page after {r['warmup']} warm-up ones, on one keep-alive connection; the floor is the "
        "page's reads called directly, in the same run.\n"
    )


def console() -> str:
    c = load("console")
    rows = _page_rows(c["pages"])
    sample = c["sample"]
    cold, warm = sample["cold_record_sample"], sample["warm_sampler"]
    return (
        _caption(c)
        + "\n"
        + table(["page", "p50", "p95", "max", "floor p50", "within 200 ms"], rows)
        + f"\nWithin 200 ms means a p95 of at most 200 ms. A console sample over the "
        f"{n(c['sizes']['documents'])}-document table costs the process that takes it "
        f"{_ms(warm['p50_ms'])} (p50; max {_ms(warm['max_ms'])}) with the table kept open, as the "
        f"dispatcher's sampler does every `sample_interval`, and {_ms(cold['p50_ms'])} when it "
        "opens the table and the database itself (a rescue pass's sample without its store).\n"
    )


def _page_rows(pages: list[dict[str, Any]], *, query: bool = True) -> list[list[str]]:
    """A row per page: its label and request (without the query string unless ``query``), its
    p50, p95, max, its floor's p50, whether it is within 200 ms."""
    return [
        [
            f"{p['label']} `{p['request'] if query else p['request'].split('?')[0]}`",
            _ms(p["p50_ms"]),
            _ms(p["p95_ms"]),
            _ms(p["max_ms"]),
            _ms(p["floor"]["p50_ms"]),
            "yes" if p["within_200ms"] else "**no**",
        ]
        for p in pages
    ]


def readme_rows() -> list[list[str]]:
    """The README performance table's line for the console."""
    c = load("console")
    pages = c["pages"]
    slowest = max(pages, key=lambda p: float(p["p95_ms"]))
    within = sum(1 for p in pages if p["within_200ms"])
    s = c["sizes"]
    return [
        [
            f"`outbox console`, each page over HTTP with {n(s['documents'])} documents and "
            f"{n(s['dead_letters'])} dead letters ({n(s['devices'])} devices, "
            f"{n(s.get('live_messages', 0))} live messages, {n(s.get('paused_keys', 0))} paused "
            f"keys, {n(s['sample_days'])} days of samples)",
            f"**{within} of {len(pages)} pages within 200 ms** (p95); the slowest, "
            f"{slowest['label']}, p50 {_ms(slowest['p50_ms'])}, p95 {_ms(slowest['p95_ms'])}; a "
            f"sample {_ms(c['sample']['warm_sampler']['p50_ms'])} per `sample_interval`",
            "`console.json`",
        ]
    ]


def kafka_dead_letters() -> str:
    """docs/console.md's Kafka dead-letter pages (``benchmarks/kafka_dead_letters.py``)."""
    k = load("kafka_dead_letters")
    rows = _page_rows(k["pages"], query=False)
    return (
        f"A dead-letter topic of {n(k['records'])} records over {k['partitions']} partitions, "
        f"pages of {k['page_size']} (`kafka_dead_letters.json`):\n\n"
        + table(["page", "p50", "p95", "max", "floor p50", "within 200 ms"], rows)
        + "\nBefore, every page read the whole topic: p50 "
        f"{_ms(k['whole_topic_read']['p50_ms'])} at this size.\n"
    )


RENDERERS = {"console": console, "kafka-dead-letters": kafka_dead_letters}
