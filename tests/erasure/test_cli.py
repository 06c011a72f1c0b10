"""``outbox erase`` through the CLI: wrong uses (one clear line each, nothing erased), pending
messages sent or dropped, --where, --dry-run and --status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox.app.cli import main
from outbox.app.facade import Outbox

QUEUE = "people"


def _workspace(ws: Path, *, dispatch: str = "immediate") -> Path:
    with Outbox.open(ws, default_destination=QUEUE, compact_every=0, dispatch=dispatch) as ob:
        for doc_id, kind in (("p1", "Person"), ("p2", "Person"), ("o1", "Order")):
            with ob.unit_of_work() as uow:
                uow.create(doc_id, type=kind).send("Created", {"id": doc_id})
    return ws


def _run(ws: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, list(args), env={"OUTBOX_WORKSPACE": str(ws), **(env or {})})


def _ids(ws: Path) -> list[str]:
    with Outbox.open(ws, compact_every=0) as ob:
        return sorted(ob.store.read(["p1", "p2", "o1"])[1])


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("erase",),
            "error: name the documents with --id ID (repeatable) or --where SQL, or give "
            "--status; exactly one of them",
        ),
        (
            ("erase", "--id", "p1", "--where", "type = 'Person'"),
            "error: name the documents with --id ID (repeatable) or --where SQL, or give "
            "--status; exactly one of them",
        ),
        (
            ("erase", "--id", "p1", "--id", "nobody"),
            "error: no document 'nobody' in {table}: nothing was erased",
        ),
        (
            ("erase", "--where", "no_such_column = 1"),
            "error: --where 'no_such_column = 1' is not a valid condition on the documents",
        ),
    ],
    ids=["no selector", "both selectors", "an unknown id", "a bad condition"],
)
def test_bad_input_is_one_line_and_erases_nothing(
    tmp_path: Path, args: tuple[str, ...], line: str
) -> None:
    ws = _workspace(tmp_path / "ws")
    result = _run(ws, *args)
    assert result.exit_code in (1, 2), result.output
    out = result.output.strip().splitlines()
    assert "Traceback" not in result.output
    with Outbox.open(ws, compact_every=0) as ob:
        expected = line.format(table=ob.store.uri)
    assert out[0].startswith(expected), out
    assert _ids(ws) == ["o1", "p1", "p2"]


def test_where_selects_current_documents_and_dry_run_changes_nothing(tmp_path: Path) -> None:
    ws = _workspace(tmp_path / "ws")
    dry = _run(ws, "erase", "--where", "type = 'Person'", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["ids"] == ["p1", "p2"]
    assert _ids(ws) == ["o1", "p1", "p2"]
    done = _run(ws, "erase", "--where", "type = 'Person'", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["erased"] == ["p1", "p2"]
    assert _ids(ws) == ["o1"]
    status = _run(ws, "erase", "--status")
    assert status.exit_code == 0, status.output
    assert "p1" in status.output
    assert "erased" in status.output


def test_pending_messages_are_sent_first_or_dropped(tmp_path: Path) -> None:
    """Deferred dispatch leaves each document's message pending. ``send`` (the default) sends it
    (a queue row, purged with the rest), ``drop`` erases it unsent (only the command row)."""
    ws = _workspace(tmp_path / "ws", dispatch="deferred")
    sent = _run(ws, "erase", "--id", "p1", "--json")
    assert sent.exit_code == 0, sent.output
    report = json.loads(sent.stdout)
    assert report["erased"] == ["p1"]
    assert report["sql_rows_deleted"]["outbox_queue_messages"] == 2  # its command and message
    dropped = _run(ws, "erase", "--id", "p2", "--pending", "drop", "--json")
    assert dropped.exit_code == 0, dropped.output
    assert json.loads(dropped.stdout)["sql_rows_deleted"]["outbox_queue_messages"] == 1
    assert _ids(ws) == ["o1"]


def test_documents_whose_messages_cannot_be_sent_are_left_for_the_next_run(
    tmp_path: Path,
) -> None:
    ws = _workspace(tmp_path / "ws", dispatch="deferred")
    refused = _run(ws, "erase", "--id", "p1", "--id", "p2", env={"OUTBOX_MAX_MESSAGE_BYTES": "8"})
    assert refused.exit_code == 3, refused.output
    assert refused.stderr.strip().splitlines()[-1] == (
        "2 documents still have pending messages; run again"
    )
    assert _ids(ws) == ["o1", "p1", "p2"]
    again = _run(ws, "erase", "--id", "p1", "--id", "p2", "--json")
    assert again.exit_code == 0, again.output
    assert _ids(ws) == ["o1"]


def test_a_table_with_deletion_vectors_is_refused_in_one_line(tmp_path: Path) -> None:
    """Another engine (Spark) enabled deletion vectors: a row one hides stays in its file, so the
    erase refuses and names the Spark command that rewrites the files."""
    import deltalake

    ws = _workspace(tmp_path / "ws")
    with Outbox.open(ws, compact_every=0) as ob:
        uri = ob.store.uri
    deltalake.DeltaTable(uri).alter.set_table_properties({"delta.enableDeletionVectors": "true"})
    result = _run(ws, "erase", "--id", "p1")
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: the table {uri} uses deletion vectors"), line
    assert "REORG TABLE delta.`<uri>` APPLY (PURGE)" in line
    assert _ids(ws) == ["o1", "p1", "p2"]


def test_the_erase_commit_and_its_checkpoint_name_no_erased_id(tmp_path: Path) -> None:
    """delta-rs writes a MERGE's generalized join filter into ``commitInfo`` (``id = '...'``);
    the erase joins on the ids' hashes, so its commit names only the bucket."""
    from testkit.raw_scan import scan_table

    ws = _workspace(tmp_path / "ws")
    doc_id = "customer-4711@example.org"
    with Outbox.open(ws, compact_every=0) as ob, ob.unit_of_work() as uow:
        uow.create(doc_id, type="Person").send("Created", {"n": 1}, destination=QUEUE)
    result = _run(ws, "erase", "--id", doc_id, "--json")
    assert result.exit_code == 0, result.output
    version = json.loads(result.stdout)["erased_version"]
    with Outbox.open(ws, compact_every=0) as ob:
        uri = ob.store.uri
    hits = {h.path.rsplit("/", 1)[-1] for h in scan_table(uri, doc_id)}
    assert f"{version:020d}.json" not in hits
    assert f"{version:020d}.checkpoint.parquet" not in hits
    assert any(h.endswith(".json") for h in hits)  # the scan sees the id in the older commits
