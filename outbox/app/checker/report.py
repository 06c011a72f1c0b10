"""The checker's verdict on one seed, and the summary over many (``outbox check``)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p95 / max (seconds, rounded to ms); zeros when there is nothing to measure."""
    if not values:
        return {"count": 0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    s = sorted(values)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))], 3)

    return {"count": len(s), "p50": at(0.5), "p95": at(0.95), "max": round(s[-1], 3)}


@dataclass
class CheckReport:
    """Exact counts for one seed. ``invariants`` maps I1..I6 to held (True) or broken (False)."""

    seed: int
    scenario: str
    duration_s: float = 0.0
    documents: int = 0
    committed: int = 0  # distinct committed messages (from the change data feed)
    delta_versions: int = 0
    deliveries: int = 0  # accepted sends, re-sends included
    duplicates: int = 0
    first_by_immediate: int = 0  # first deliveries made right after the commit
    first_by_worker: int = 0  # ... made by run-dispatcher (retry command or rescue)
    #: First deliveries only the rescuer can have caused: by a worker, on a document no retry
    #: command had named before, after the rescuer enqueued one (see ``verify``).
    rescued_first_deliveries: int = 0
    stranded_rounds: int = 0  # rounds saved with every send failing and no retry command
    lost: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    saves: int = 0
    saves_failed: list[str] = field(default_factory=list)  # I4: error class and message
    watermark_regressions: list[str] = field(default_factory=list)  # I4
    seq_gaps: list[str] = field(default_factory=list)
    not_dispatched: list[str] = field(default_factory=list)  # watermark < last_seq at the end
    occ_retries: int = 0
    commit_retries: int = 0
    crashes: dict[str, int] = field(default_factory=dict)  # how each process died / crash events
    sigkills_sent: int = 0
    outages: int = 0
    rescue_passes: int = 0
    rescue_passes_interrupted: int = 0  # the checker's own injected interruption
    rescue_passes_failed: int = 0  # an OutboxError (queue down, feed gone...): retried next pass
    #: Anything else a pass raised (a raw driver error, a rescuer bug): the seed fails.
    rescue_errors: list[str] = field(default_factory=list)
    rescue_commands: int = 0
    dead_lettered: int = 0
    drained: bool = False
    latency_immediate: dict[str, float] = field(default_factory=dict)
    latency_rescued: dict[str, float] = field(default_factory=dict)  # real seconds
    rescue_delay_simulated_s: float = 0.0
    rescue_delay_real_s: float = 0.0
    invariants: dict[str, bool] = field(default_factory=dict)
    #: Every planned fault (crash points, SIGKILLs, stranded rounds) -> did it fire?
    faults: dict[str, bool] = field(default_factory=dict)
    unfired_faults: list[str] = field(default_factory=list)
    mutation: str = ""  # the deliberately broken build this seed ran against ("" = none)
    sql: str = "sqlite"  # the queue's and checkpoints' database: sqlite or postgresql
    engine: str = "local"  # the rescuer's engine: local or spark
    writer: str = "python"  # python, or spark: a Spark driver among the writers
    spark_batches: int = 0  # batches the Spark writer committed (its crashed one included)
    spark_commit_retries: int = 0  # its MERGEs that lost a race to a concurrent commit
    # Deletes through the library: counted from the table's feed (tombstones, new lives) and the
    # journals (refusals, lost races); the current documents read against the feed's model.
    tombstones: int = 0  # tombstones committed (``uow.delete``)
    new_lives: int = 0  # documents created again over a tombstone whose last messages were sent
    creates_refused: int = 0  # creates refused over a tombstone whose last messages were not
    delete_conflicts: int = 0  # deletes that lost a race to a save and were retried
    documents_current: int = 0  # what ``read_documents`` returned
    documents_deleted: int = 0  # ids the model says are deleted (none may be returned)
    documents_mismatched: list[str] = field(default_factory=list)  # reader vs model
    #: A new life over an unsent tombstone, or the supervisor's delete step not going as the
    #: rules say (its create over the unsent tombstone accepted, over the sent one refused).
    delete_violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every invariant held, the run drained, no rescue pass broke unexpectedly, and
        something was committed at all (a run where nothing ran proves nothing)."""
        return (
            bool(self.invariants)
            and all(self.invariants.values())
            and self.drained
            and not self.rescue_errors
            and self.committed > 0
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        for name in ("lost", "out_of_order", "phantoms", "mismatched"):
            d[f"{name}_count"] = len(d[name])
            d[name] = d[name][:20]
        return d

    def summary(self) -> str:
        held = " ".join(f"{k}={'ok' if v else 'BROKEN'}" for k, v in self.invariants.items())
        return (
            f"seed {self.seed}: {'OK' if self.ok else 'FAILED'} in {self.duration_s:.1f}s; "
            f"committed {self.committed} msgs in {self.documents} docs, delivered "
            f"{self.deliveries} ({self.duplicates} duplicates), lost {len(self.lost)}, "
            f"out of order {len(self.out_of_order)}, phantoms {len(self.phantoms)}, rescued "
            f"first {self.rescued_first_deliveries}; {self.tombstones} tombstones, "
            f"{self.new_lives} new lives, {self.creates_refused} creates refused; {held}"
            + ("" if self.committed else "; NOTHING COMMITTED")
            + (
                f"; documents not as the model says: {self.documents_mismatched[:5]}"
                if self.documents_mismatched
                else ""
            )
            + (
                f"; delete rules broken: {self.delete_violations[:5]}"
                if self.delete_violations
                else ""
            )
            + (
                ""
                if self.drained
                else f"; NOT DRAINED (not dispatched: {self.not_dispatched[:5]}, lost "
                f"{self.lost[:5]}, crashes {self.crashes})"
            )
            + (
                f"; planned faults that did not fire: {self.unfired_faults}"
                if self.unfired_faults
                else ""
            )
            + (
                f"; {len(self.rescue_errors)} unexpected rescue error(s), first: "
                f"{self.rescue_errors[0]}"
                if self.rescue_errors
                else ""
            )
        )


def aggregate(reports: list[CheckReport]) -> dict[str, Any]:
    """Totals over seeds, for the soak's last table."""
    keys = (
        "committed",
        "deliveries",
        "duplicates",
        "first_by_immediate",
        "first_by_worker",
        "rescued_first_deliveries",
        "stranded_rounds",
        "saves",
        "occ_retries",
        "commit_retries",
        "sigkills_sent",
        "outages",
        "rescue_passes",
        "rescue_passes_interrupted",
        "rescue_passes_failed",
        "rescue_commands",
        "dead_lettered",
        "tombstones",
        "new_lives",
        "creates_refused",
        "delete_conflicts",
    )
    total: dict[str, Any] = {k: sum(int(getattr(r, k)) for r in reports) for k in keys}
    total["seeds"] = len(reports)
    total["failed_seeds"] = [r.seed for r in reports if not r.ok]
    for name in (
        "lost",
        "out_of_order",
        "phantoms",
        "mismatched",
        "saves_failed",
        "rescue_errors",
        "documents_mismatched",
        "delete_violations",
    ):
        total[name] = sum(len(getattr(r, name)) for r in reports)
    total["watermark_regressions"] = sum(len(r.watermark_regressions) for r in reports)
    total["faults_planned"] = sum(len(r.faults) for r in reports)
    total["unfired_faults"] = {r.seed: r.unfired_faults for r in reports if r.unfired_faults}
    crashes: dict[str, int] = {}
    for r in reports:
        for k, v in r.crashes.items():
            crashes[k] = crashes.get(k, 0) + v
    total["crashes"] = dict(sorted(crashes.items()))
    total["rescued_latency_max_s"] = max(
        (r.latency_rescued.get("max", 0.0) for r in reports), default=0.0
    )
    return total


def seed_row(r: CheckReport) -> dict[str, Any]:
    """One seed in a results file: the counts, not the whole report (a soak has thousands)."""
    return {
        "seed": r.seed,
        "ok": r.ok,
        "committed": r.committed,
        "deliveries": r.deliveries,
        "duplicates": r.duplicates,
        "lost": len(r.lost),
        "out_of_order": len(r.out_of_order),
        "phantoms": len(r.phantoms),
        "sigkills_sent": r.sigkills_sent,
        "crashes": sum(r.crashes.values()),
        "faults": len(r.faults),
        "unfired_faults": r.unfired_faults,
        "rescued_first_deliveries": r.rescued_first_deliveries,
        "duration_s": r.duration_s,
    }


def results_document(reports: list[CheckReport], options: dict[str, Any]) -> dict[str, Any]:
    """What ``outbox check --results FILE`` writes after every seed: the options, the totals,
    one row per seed, and the whole report of every seed that failed."""
    return {
        "kind": "outbox-check",
        "options": options,
        "total": aggregate(reports),
        "seeds": [seed_row(r) for r in reports],
        "failed": [r.to_dict() for r in reports if not r.ok],
    }


def write_results(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` in one rename: a reader (or a soak stopped mid-way) never sees half a
    file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", "utf-8")
    os.replace(tmp, path)
