"""The device-fleet results blocks (``benchmarks/results/gateway.json`` and ``sessions.json``),
for ``benchmarks.report``."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table


def _run(label: str, r: dict[str, Any], *, waited: bool = False) -> list[str]:
    tasks = f"{n(r['tasks_waited_for'])} of {n(r['tasks'])}" if waited else n(r["tasks"])
    return [label, tasks, f"{n(r['wall_s'], 2)} s", f"{n(r['per_s'], 1)} tasks/s"]


def gateway() -> str:
    g = load("gateway")
    q, b = g["queue"], g["queue_batched"]
    floor = max(q["runs"], key=lambda r: float(r["per_s"]))
    batched = max(b["runs"], key=lambda r: float(r["per_s"]))
    acking = n(g["acking_alone"]["tasks"] // g["tasks_per_device"])
    rows = [
        _run("the queue's receive+complete (the floor: same database, same run)", floor),
        _run(
            "the queue's receive, completed in batches by id (the gateway's database work)", batched
        ),
        _run("the gateway, every device acking at once", g["all_acking"]),
        _run(f"{acking} acking devices alone", g["acking_alone"]),
        _run(
            f"the same {acking}, with the other devices silent (half) and offline (half)",
            g["with_silent_and_offline"],
            waited=True,
        ),
    ]
    mem = g["gateway_memory_mb"]
    slower = n(g["silent_and_offline_slowdown"], 3)
    return (
        table(["run", "tasks", "time", "rate"], rows)
        + f"\nThe gateway: **{n(g['gateway_over_queue'], 3)}×** the floor (goal at least "
        f"{g['goals']['gateway_over_queue']}×), {n(g['gateway_over_queue_batched'], 3)}× the "
        f"batched floor; the acking devices finish in **{slower}×** "
        f"their time alone (goal at most {g['goals']['silent_and_offline_slowdown']}×); at most "
        f"{g['max_in_flight_per_device']} task in flight per device; the gateway process's peak "
        f"RSS {n(mem['peak'], 1)} MB ({n(mem['ready'], 1)} MB connected, before serving). "
        f"{n(g['devices'])} devices × {g['tasks_per_device']} tasks, SQLite, load average "
        f"{g['load_average_1m_at_start']} at the start.\n"
    )


def sessions() -> str:
    s = load("sessions")
    rows = []
    for backend, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        b = s[backend]
        rows.append(
            [
                label,
                f"{n(b['plain_per_s'], 1)} msg/s",
                f"{n(b['sessions_per_s'], 1)} msg/s ({n(b['plain_over_sessions'], 3)}×)",
                f"{n(b['sessions_held_per_s'], 1)} msg/s ({n(b['plain_over_sessions_held'], 3)}×)",
            ]
        )
    return table(
        [
            "database",
            "plain",
            f"{n(s['sessions'])} sessions (plain ÷ this)",
            "with 10% held, 10% paused",
        ],
        rows,
    )


def readme_rows() -> list[list[str]]:
    """The README performance table's line for the device gateway."""
    g = load("gateway")
    return [
        [
            f"MQTT device gateway, {n(g['devices'])} devices on a connection each × "
            f"{g['tasks_per_device']} tasks, instant acks, SQLite",
            f"{n(g['all_acking']['per_s'], 1)} tasks/s: **{n(g['gateway_over_queue'], 3)}×** the "
            f"queue's receive+complete in the same run (goal 0.9×); with a tenth silent and a "
            f"tenth offline the others finish in {n(g['silent_and_offline_slowdown'], 3)}× their "
            f"time alone (goal at most 1.2×); peak RSS {n(g['gateway_memory_mb']['peak'], 1)} MB",
            "`gateway.json`",
        ]
    ]


RENDERERS = {"devices-gateway": gateway, "devices-sessions": sessions}
