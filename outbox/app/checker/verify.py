"""The verdict on one seed: the broker log held against the change data feed, every planned fault
checked for having fired, and the rescuer's own share of first deliveries counted.

``rescued_first_deliveries`` is what proves the rescuer was needed: a first delivery made by a
worker, on a document for which no writer had journaled a retry command before that delivery,
and for which the rescuer had enqueued a new command before it. Retry commands are journaled
*before* they are enqueued, so a writer killed in between can only make the count smaller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outbox.app.checker import tombstones
from outbox.app.checker.broker import Delivery, read_log
from outbox.app.checker.documents import check_documents
from outbox.app.checker.execute import Run
from outbox.app.checker.reap import Child
from outbox.app.checker.report import CheckReport, percentiles
from outbox.app.checker.truth import Truth, read_truth


def verify(run: Run, root: Path, first_command_at: dict[str, float]) -> None:
    """Fill ``run.report`` from what the table, the broker log and the journals say."""
    from dispatcher.invariants import verify_deliveries

    report = run.report
    run.store.refresh()
    truth = read_truth(run.store.delta_table)
    deliveries = read_log(root / "broker.log")
    inv = verify_deliveries(truth.committed, [d.message for d in deliveries])
    report.documents = len(truth.committed)
    report.committed = inv.committed
    report.delta_versions = truth.versions
    report.deliveries = inv.delivered
    report.duplicates = inv.duplicates
    report.lost, report.out_of_order = inv.lost, inv.out_of_order
    report.phantoms, report.mismatched = inv.phantoms, inv.mismatched
    report.watermark_regressions = truth.watermark_regressions
    report.seq_gaps = truth.seq_gaps + truth.changed_content
    first = _first_deliveries(deliveries)
    _latencies(report, truth, first)
    retries = _retry_commands(run.children.writers)
    # A later life of a document is the supervisor's re-create step, handed to the workers by a
    # command of the supervisor's own: the rescuer's earlier command for the first life must not
    # make those deliveries look rescued.
    later_lives = {m.message_id for key, ms in truth.committed.items() if "~" in key for m in ms}
    report.rescued_first_deliveries = sum(
        1
        for d in first.values()
        if d.role == "worker"
        and d.message.message_id in truth.committed_at
        and d.message.message_id not in later_lives
        and _rescued(str(d.message.session_id), d.at, retries, first_command_at)
    )
    report.not_dispatched = _not_dispatched(run.store, truth)
    _journals(report, run.children.writers, run.children.deaths)
    _faults(run)
    check_documents(run, truth)
    report.invariants = {
        "I1 no loss": not report.lost and not report.not_dispatched and not truth.seq_gaps,
        "I2 order": not report.out_of_order,
        "I3 no phantom": not report.phantoms,
        "I4 no interference": not report.saves_failed and not report.watermark_regressions,
        "I6 idempotence": not report.mismatched and not truth.changed_content,
        "documents": not report.documents_mismatched and not report.delete_violations,
    }


def _first_deliveries(deliveries: list[Delivery]) -> dict[str, Delivery]:
    first: dict[str, Delivery] = {}
    for d in deliveries:
        first.setdefault(d.message.message_id, d)
    return first


def _latencies(report: CheckReport, truth: Truth, first: dict[str, Delivery]) -> None:
    immediate: list[float] = []
    rescued: list[float] = []
    for mid, d in first.items():
        at = truth.committed_at.get(mid)
        if at is None:
            continue
        (immediate if d.role == "writer" else rescued).append(max(0.0, d.at - at))
    report.first_by_immediate, report.first_by_worker = len(immediate), len(rescued)
    report.latency_immediate = percentiles(immediate)
    report.latency_rescued = percentiles(rescued)


def _retry_commands(writers: list[Child]) -> dict[str, float]:
    """Document id -> the earliest time any writer journaled a retry command for it."""
    out: dict[str, float] = {}
    for w in writers:
        for e in w.journal():
            if e.get("event") == "retry":
                for doc in e.get("docs", []):
                    out[doc] = min(float(e["at"]), out.get(doc, float("inf")))
    return out


def _rescued(doc: str, at: float, retries: dict[str, float], rescue: dict[str, float]) -> bool:
    return retries.get(doc, float("inf")) > at and rescue.get(doc, float("inf")) <= at


def _not_dispatched(store: Any, truth: Truth) -> list[str]:
    ids = sorted(truth.doc_ids)
    _, rows = store.read(ids) if ids else (0, {})
    return [
        f"{i}: dispatched_seq {r.dispatched_seq} < last_seq {r.last_seq}"
        for i, r in rows.items()
        if r.dispatched_seq < r.last_seq
    ]


def _journals(report: CheckReport, writers: list[Child], deaths: dict[str, int]) -> None:
    crashes = dict(deaths)
    for w in writers:
        for e in w.journal():
            if e.get("event") != "round":
                continue
            report.saves += 1 if e.get("saved") else 0
            report.occ_retries += int(e.get("occ_retries", 0))
            report.commit_retries += int(e.get("commit_retries", 0))
            report.stranded_rounds += 1 if e.get("stranded") and e.get("saved") else 0
            if e.get("crash"):
                key = f"writer raise at {e['crash']}"
                crashes[key] = crashes.get(key, 0) + 1
            if not e.get("saved"):
                report.saves_failed.append(f"{e.get('error')}: {e.get('message')}")
            delete = e.get("delete") or {}
            report.creates_refused += int(delete.get("refused", 0)) + int(e.get("refused", 0))
            report.delete_conflicts += int(delete.get("conflicts", 0))
    report.crashes = dict(sorted(crashes.items()))


def _faults(run: Run) -> None:
    """Every planned fault and whether it fired."""
    sc, children = run.scenario, run.children
    fired: dict[str, bool] = {}
    for child in children.writers + children.workers:
        planned = child.planned_crash
        if planned:
            fired[f"{child.role} {child.index} crash {planned}"] = child.crash_fired()
    for kill in sc.kills:
        fired[kill.describe()] = kill in run.kills_fired
    stranded = {
        (w.cfg["index"], e["round"])
        for w in children.writers
        for e in w.journal()
        if e.get("event") == "round" and e.get("stranded") and e.get("saved")
    }
    for w in sc.writers:
        for r in w.stranded:
            fired[f"stranded writer {w.index} round {r}"] = (w.index, r) in stranded
    fired["external delete and re-create of a dispatched document"] = run.recreated is not None
    fired[tombstones.KEPT] = run.kept_deleted is not None
    fired[tombstones.REBORN] = run.reborn is not None
    run.report.faults = fired
    run.report.unfired_faults = [name for name, ok in fired.items() if not ok]
