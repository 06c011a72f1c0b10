"""The object store's results block (``benchmarks/results/object_store.json``, issue 32), for
``benchmarks.report``."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from benchmarks.report_common import load, n, table

LABELS = {"local": "local disk", "azure": "Azure (Azurite)", "s3": "S3 (moto)"}


def object_store() -> str:
    d = load("object_store")
    rows = []
    for key, label in LABELS.items():
        s = d["stores"][key]
        r, u = s["ratio"], s["upkeep"]
        f = s["rescuer_feed_pass"]
        p50s = [w["p50_ms"] for w in u["windows"]]  # the first starts on an empty log
        rows.append(
            [
                label,
                f"**{n(r['save_vs_raw_ratio'], 2)}×** ({n(r['unit_of_work']['p50_ms'], 1)} vs "
                f"{n(r['raw']['p50_ms'], 1)} ms p50)",
                f"{n(s['dispatch']['messages_per_second'])} msg/s "
                f"({n(d['dispatch_vs_local'][key], 2)}× local)",
                f"{n(f['seconds'] * 1000)} ms ({n(f['change_rows'])} rows)",
                f"{n(u['max_over_min_window_p50'], 2)}× over {n(u['commits'])} commits "
                f"(window p50 {n(min(p50s), 1)}–{n(max(p50s), 1)} ms); "
                f"{n(max(p50s[1:]) / min(p50s[1:]), 2)}× after the first window",
            ]
        )
    header = [
        "store",
        "save / the same save in raw deltalake",
        "commit to settled (SQL queue)",
        "rescuer feed pass, 20 commits",
        "commit p50, max/min window with upkeep",
    ]
    return table(header, rows)


def readme_rows() -> list[list[str]]:
    """The README performance table's line for object stores."""
    d = load("object_store")
    stores = ("azure", "s3")
    ratios = " / ".join(f"{n(d['stores'][k]['ratio']['save_vs_raw_ratio'], 2)}×" for k in stores)
    rates = " / ".join(
        f"{n(d['stores'][k]['dispatch']['messages_per_second'])} msg/s "
        f"({n(d['dispatch_vs_local'][k], 2)}× local)"
        for k in stores
    )
    return [
        [
            "the table on Azure (Azurite) / S3 (moto's server), local servers: a unit of work vs "
            "the same save in raw deltalake; 100-document units of work, commit to settled",
            f"{ratios}; {rates}",
            "`object_store.json`",
        ]
    ]


RENDERERS = {"object-store": object_store}
