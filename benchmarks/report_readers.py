"""The readers' results blocks (``benchmarks/results/current_documents.json``, issue 44), for
``benchmarks.report``."""

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


def readme_rows() -> list[list[str]]:
    """The performance table's lines for the table's readers."""
    return _current_rows(load("current_documents"))


def readers() -> str:
    return table(["what", "figure", "source"], readme_rows())


RENDERERS = {"readers": readers}
