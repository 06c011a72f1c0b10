"""The current documents, read as a user reads them (``read_documents``: the one definition of
current documents, ``outbox.delta.current``), held against the model the change data feed gives
(``truth.Documents``): every document the model has is returned as its last committed version
left it, and no deleted id is returned.

Why a model from the feed rather than the rows the table keeps: a reader folds those rows (a
document's newest version, its life's watermark, tombstones hidden); the feed says what each
commit *wrote*, so a reader that shows a tombstone, or a fold that drops a live document's newest
version, disagrees with it. Both of the readers' forms are read: the whole table (the window
query) and by id (the Arrow fold the store's reads use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.app.checker.execute import Run
    from outbox.app.checker.truth import Image, Truth

#: What a returned document must carry as the model has it (and ``dispatched_seq``: its life's
#: watermark).
FIELDS = ("version", "incarnation", "type", "state", "last_seq")


def check_documents(run: Run, truth: Truth) -> None:
    """Fill the report's document counts and ``documents_mismatched``."""
    from outbox.app.facade import read_documents

    report, model = run.report, truth.model
    report.tombstones = model.tombstones
    report.new_lives = model.new_lives
    report.delete_violations.extend(model.violations)
    expected = model.current()
    deleted = set(model.deleted())
    report.documents_deleted = len(deleted)
    whole = read_documents(settings=run.settings).to_pylist()
    report.documents_current = len(whole)
    problems = compare("all documents", whole, expected, deleted, model.watermarks)
    ids = sorted(truth.doc_ids)
    by_id = read_documents(settings=run.settings, ids=ids).to_pylist() if ids else []
    problems += compare("by id", by_id, expected, deleted, model.watermarks)
    report.documents_mismatched = problems


def compare(
    how: str,
    rows: list[dict[str, Any]],
    expected: dict[str, Image],
    deleted: set[str],
    watermarks: dict[str, int],
) -> list[str]:
    """What differs between a reader's ``rows`` and the model, one line per document."""
    out: list[str] = []
    got = {str(r["id"]): r for r in rows}
    for doc_id in sorted(set(got) - set(expected)):
        why = "deleted" if doc_id in deleted else "never written"
        out.append(f"{how}: {doc_id!r} returned, but the model has it {why}")
    for doc_id in sorted(set(expected) - set(got)):
        out.append(f"{how}: {doc_id!r} missing (version {expected[doc_id].version})")
    for doc_id in sorted(set(got) & set(expected)):
        m, r = expected[doc_id], got[doc_id]
        want: dict[str, Any] = {name: getattr(m, name) for name in FIELDS}
        want["dispatched_seq"] = watermarks.get(m.life, 0)
        diff = {k: (r.get(k), v) for k, v in want.items() if r.get(k) != v}
        if diff:
            out.append(f"{how}: {doc_id!r} (returned, model): {diff}")
    return out
