"""The results blocks of the table's readers and its history (``current_documents.json`` and
``replay.json``, issue 44), for ``benchmarks.report``."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table


def _current_rows(c: dict[str, Any]) -> list[list[str]]:
    ids, whole = c["ids_100"], c["whole_table"]
    docs = n(c["sizes"]["documents"])
    return [
        [
            f"current documents of a {docs}-document table ({n(c['sizes']['rows'])} rows: "
            "versions and mark rows), `ob.documents(ids)` of 100 ids / the whole table, vs the "
            "same read done by hand with deltalake, same run",
            f"{n(ids['ours']['p50_ms'], 1)} vs {n(ids['by_hand']['p50_ms'], 1)} ms p50 "
            f"(**{n(c['ratio_ids'], 2)}×**) / {n(whole['ours']['p50_ms'] / 1000, 1)} vs "
            f"{n(whole['by_hand']['p50_ms'] / 1000, 1)} s (**{n(c['ratio_whole_table'], 2)}×**; "
            f"goal at most {n(c['goal'], 1)}×)",
            "`current_documents.json`",
        ]
    ]


def _replay_rows(r: dict[str, Any]) -> list[list[str]]:
    d, p = r["dispatcher"], r["replay"]
    return [
        [
            f"`outbox replay` of {n(r['messages'])} messages ({r['per_doc']} a document, "
            f"{n(r['per_commit'])} documents a commit) with new ids through a `run-dispatcher` "
            "worker vs the dispatcher's immediate dispatch of the same messages, SQL transport "
            "on SQLite, same run",
            f"{n(p['messages_per_second'])} vs {n(d['messages_per_second'])} msg/s "
            f"(**{n(r['replay_over_dispatcher'], 2)}×**, goal {n(r['goal'], 1)}×); planning "
            f"and enqueueing included {n(p['messages_per_second_with_planning'])} msg/s "
            f"({n(r['replay_with_planning_over_dispatcher'], 2)}×; {n(p['chunks'])} chunks)",
            "`replay.json`",
        ]
    ]


def readme_rows() -> list[list[str]]:
    """The performance table's lines for the table's readers and its replay."""
    return _current_rows(load("current_documents")) + _replay_rows(load("replay"))


def readers() -> str:
    return table(["what", "figure", "source"], _current_rows(load("current_documents")))


def replay() -> str:
    return table(["what", "figure", "source"], _replay_rows(load("replay")))


RENDERERS = {"readers": readers, "replay": replay}
