"""``outbox trace ID`` (issue 46, item 1) through the CLI, on SQLite and PostgreSQL: a document's
versions with their writers, a message accepted and waiting in its queue, one pending with its
age (the clock injected), its ProcessDocument command, a dead letter and its requeue, the search
by message id and by correlation id, the ``--json`` shape, the piped text, and one ``error:``
line for an unknown id or a workspace without a table."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox.app.cli import main
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock

#: The saves' clocks, and the trace's 90 s after T1: from now on, so the queue's own clock (the
#: requeue's time) is not after the trace's "now" (a requeued message would read as scheduled).
T0 = datetime.now(UTC).replace(microsecond=0)
T1 = T0 + timedelta(minutes=5)
QUEUE = "shipments"


@pytest.fixture
def ws(tmp_path: Path, sql_url: str) -> Path:
    return trace_workspace(tmp_path / "ws", sql_url)


def trace_workspace(path: Path, sql_url: str) -> Path:
    """pkg-1: "Left" sent (correlation corr-7) and marked, then "Arrived" saved with deferred
    dispatch (pending, a ProcessDocument command waiting); pkg-2: an unrelated document. The
    console's trace page (tests/console/test_console_trace.py) shows the same workspace."""
    path.mkdir()
    (path / "outbox.toml").write_text(f'sql_url = "{sql_url}"\n')
    common: dict[str, Any] = {"transport": "sql", "default_destination": QUEUE, "compact_every": 0}
    with Outbox.open(path, clock=ManualClock(T0), **common) as ob:
        with ob.unit_of_work() as uow:
            uow.create("pkg-1", type="Package").send(
                "Left", {"at": "Seattle"}, correlation_id="corr-7"
            )
        with ob.unit_of_work() as uow:
            uow.create("pkg-2", type="Package").send("Left", {"at": "Boise"})
    with (
        Outbox.open(path, clock=ManualClock(T1), dispatch="deferred", **common) as ob,
        ob.unit_of_work() as uow,
    ):
        doc = uow.get("pkg-1")
        doc.state["arrived"] = True
        doc.send("Arrived", {"at": "Portland"})
    return path


def _run(
    ws: Path,
    *args: str,
    monkeypatch: pytest.MonkeyPatch | None = None,
    now: datetime | None = None,
) -> Any:
    if monkeypatch is not None:  # the trace's "now": 90 s after the pending message was saved
        at = now or T1 + timedelta(seconds=90)
        monkeypatch.setattr("outbox.app.cli.trace.SystemClock", lambda: ManualClock(at))
    return CliRunner().invoke(main, ["-w", str(ws), *args])


def _trace(
    ws: Path, query: str, monkeypatch: pytest.MonkeyPatch, now: datetime | None = None
) -> dict[str, Any]:
    result = _run(ws, "trace", query, "--json", monkeypatch=monkeypatch, now=now)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _by_type(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["type"]: m for m in doc["messages"]}


def test_a_document_its_versions_a_sent_message_and_a_pending_one(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _trace(ws, "pkg-1", monkeypatch)
    assert data["matched_by"] == "document_id"
    [doc] = data["documents"]
    assert (doc["id"], doc["version"], doc["last_seq"], doc["dispatched_seq"]) == ("pkg-1", 2, 2, 1)
    # the history: two saves by the embedded writer, a mark by the dispatcher between them
    rows = [(c["writer"], c["document_version"], c["dispatched_seq"]) for c in doc["commits"]]
    assert rows == [("outbox", 1, 0), ("dispatcher", 0, 1), ("outbox", 2, 1)]
    left, arrived = _by_type(doc)["Left"], _by_type(doc)["Arrived"]
    assert doc["commits"][0]["added"] == [left["message_id"]]
    assert doc["commits"][2]["added"] == [arrived["message_id"]]
    # accepted by the transport, waiting in its queue
    assert (left["pending"], left["fate"], left["queued"]["queue"]) == (False, "active", QUEUE)
    # pending, with its age from the injected clock
    assert (arrived["pending"], arrived["fate"], arrived["pending_age_s"]) == (
        True,
        "pending",
        90.0,
    )
    assert arrived["queued"] is None
    assert arrived["dead_letter"] is None
    # the deferred dispatch's command, waiting in the command queue
    [command] = doc["commands"]
    assert (command["up_to_seq"], command["state"]) == (2, "active")


def test_a_dead_letter_then_its_requeue_found_by_message_and_correlation_id(
    ws: Path, sql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher.queue import SqlQueue

    with SqlQueue(sql_url) as queue:
        [received] = queue.receive(QUEUE, session_id="pkg-1")
        queue.dead_letter(received, "BadAddress", "no such street")
    message_id = received.message_id

    data = _trace(ws, message_id, monkeypatch)
    assert data["matched_by"] == "message_id"
    [doc] = data["documents"]
    left = _by_type(doc)["Left"]
    assert left["message_id"] == message_id
    assert left["fate"] == "dead-lettered"
    assert left["queued"] is None
    dead = left["dead_letter"]
    assert (dead["reason"], dead["delivery_count"], dead["queue"]) == ("BadAddress", 1, QUEUE)

    requeued = _run(ws, "dead-letters", "--sql", "requeue", str(dead["id"]))
    assert requeued.exit_code == 0, requeued.output

    # The requeue is stamped by the system clock (the CLI's): the trace looks from after it. T0
    # is taken when the module is imported, which on a busy run can be long before this test.
    data = _trace(ws, "corr-7", monkeypatch, now=datetime.now(UTC) + timedelta(minutes=1))
    assert data["matched_by"] == "correlation_id"
    assert [d["id"] for d in data["documents"]] == ["pkg-1"]
    left = _by_type(data["documents"][0])["Left"]
    assert (left["fate"], left["dead_letter"], left["queued"]["delivery_count"]) == (
        "active",
        None,
        0,
    )


def test_the_json_shape(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys docs/trace.md documents, no more and no fewer."""
    data = _trace(ws, "pkg-1", monkeypatch)
    assert set(data) == {"query", "matched_by", "table_version", "documents"}
    doc = data["documents"][0]
    assert set(doc) == {
        "id", "type", "incarnation", "version", "deleted", "last_seq", "dispatched_seq",
        "history_from", "commits", "messages", "commands", "rescues", "notes",
    }  # fmt: skip
    assert set(doc["commits"][0]) == {
        "table_version", "committed_at", "writer", "operation", "change", "document_version",
        "last_seq", "dispatched_seq", "added",
    }  # fmt: skip
    assert set(doc["messages"][0]) == {
        "seq", "message_id", "destination", "type", "session_id", "correlation_id",
        "created_at", "first_table_version", "fate", "pending", "pending_age_s", "queued",
        "dead_letter",
    }  # fmt: skip
    assert set(doc["messages"][0]["queued"]) == {
        "queue", "state", "sequence_number", "delivery_count", "enqueued_at", "not_before",
        "locked_at", "locked_until",
    }  # fmt: skip
    assert set(doc["commands"][0]) == {
        "command_id", "up_to_seq", "state", "delivery_count", "at", "dead_letter_id", "reason",
    }  # fmt: skip


def test_piped_text_is_aligned_tables(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(ws, "trace", "pkg-1", monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "# versions (the table's history)" in lines
    assert "# messages" in lines
    [arrived] = [line for line in lines if " Arrived " in line]
    assert arrived.split()[4:] == ["pending", "waiting", "1m30s"]


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
def test_an_unknown_id_is_one_error_line(ws: Path) -> None:
    result = _run(ws, "trace", "no-such-thing")
    assert result.exit_code == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: no document, message or correlation id 'no-such-thing' in ")
    assert "(fix: check the id" in line


def test_a_workspace_without_its_table_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["-w", str(tmp_path / "nothing"), "trace", "pkg-1"])
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ")
    assert "(fix: " in line
    assert "Traceback" not in result.output


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
def test_after_the_fold_a_sent_message_is_found_in_the_history(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fold removes version 1, the only row that carried "Left": the message id is then
    found in the change data feed, and the fold's commit reads as the fold's."""
    from outbox.delta.fold import fold_table

    before = _by_type(_trace(ws, "pkg-1", monkeypatch)["documents"][0])["Left"]["message_id"]
    with Outbox.open(ws, transport="sql", compact_every=0) as ob:
        assert fold_table(ob.store, at=0.0).to_dict()
    data = _trace(ws, before, monkeypatch)
    assert data["matched_by"] == "message_id"
    [doc] = data["documents"]
    folds = [c for c in doc["commits"] if c["writer"] == "fold"]
    assert folds
    assert {c["change"] for c in folds} >= {"delete"}
    assert _by_type(doc)["Left"]["message_id"] == before


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
def test_since_reads_less_history_and_the_current_row_still_gives_pending_messages(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the history cut at the newest version (as the log trim cuts it), the versions
    before it are not shown, and the pending message, which only the current row then holds,
    still gets its fate; a version past the table's is one error line."""
    with (
        Outbox.open(ws, transport="sql", dispatch="deferred", compact_every=0) as ob,
        ob.unit_of_work() as uow,
    ):
        uow.get("pkg-2").state["seen"] = True  # a newer commit that is not pkg-1's
    latest = _trace(ws, "pkg-1", monkeypatch)["table_version"]
    result = _run(ws, "trace", "pkg-1", "--since", str(latest), "--json", monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output
    [doc] = json.loads(result.stdout)["documents"]
    assert doc["history_from"] == latest
    assert doc["commits"] == []
    arrived = _by_type(doc)["Arrived"]
    assert (arrived["fate"], arrived["pending_age_s"]) == ("pending", 90.0)
    assert arrived["first_table_version"] is None

    result = _run(ws, "trace", "pkg-1", "--since", str(latest + 1))
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: --since {latest + 1} is not a version of the table")


@pytest.mark.parametrize(
    ("info", "writer"),
    [
        ({"operation": "WRITE", "outbox.operation": "save"}, "outbox"),
        ({"operation": "WRITE", "outbox.operation": "watermark"}, "dispatcher"),
        ({"operation": "MERGE", "outbox.operation": "fold"}, "fold"),
        ({"operation": "MERGE", "engineInfo": "Apache-Spark/3.5.3 Delta-Lake/3.3.0"}, "spark"),
        ({"operation": "DELETE", "engineInfo": "delta-rs:py-1.6.6"}, "foreign"),
        ({}, "foreign"),
    ],
)
def test_who_wrote_a_commit(info: dict[str, Any], writer: str) -> None:
    from outbox.app.trace import writer_of

    assert writer_of(info)[0] == writer


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
def test_a_locked_message_shows_its_lock_and_its_end(
    ws: Path, sql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher.queue import SqlQueue

    now = T1 + timedelta(seconds=90)  # the trace's clock
    with SqlQueue(sql_url, clock=ManualClock(now)) as queue:
        [received] = queue.receive(QUEUE, session_id="pkg-1")  # held, not settled
        until = now + queue.lock_duration
    left = _by_type(_trace(ws, "pkg-1", monkeypatch)["documents"][0])["Left"]
    assert left["fate"] == "locked"
    assert left["message_id"] == received.message_id
    assert left["queued"]["locked_until"] == until.isoformat()
    assert left["queued"]["delivery_count"] == 1
    text = _run(ws, "trace", "pkg-1", monkeypatch=monkeypatch).stdout
    assert f"locked until {until.isoformat(timespec='seconds')}" in text


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
def test_a_deleted_document_is_traced_to_its_tombstone(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        Outbox.open(ws, transport="sql", default_destination=QUEUE, compact_every=0) as ob,
        ob.unit_of_work() as uow,
    ):
        uow.delete("pkg-2")
    [doc] = _trace(ws, "pkg-2", monkeypatch)["documents"]
    assert (doc["deleted"], doc["version"]) == (True, 2)
    assert [c["document_version"] for c in doc["commits"] if c["writer"] == "outbox"] == [1, 2]


def test_a_rescue_pass_that_commanded_the_document_is_in_its_trace(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pkg-1's "Arrived" is pending (deferred dispatch); a rescue pass an hour on commands it,
    as ``outbox rescue`` builds it (``open_rescuer``: its journal in the workspace's database,
    where its checkpoints are). The trace lists the pass after its command is handled, in the
    JSON and the text; pkg-2, not pending, has none."""
    from outbox.app.checker.rescue import OffsetClock
    from outbox.app.rescue import open_rescuer
    from outbox.core.clock import SystemClock
    from outbox.core.settings import Settings

    settings = Settings.load(ws)
    with open_rescuer(settings, clock=OffsetClock(3600), queue_clock=SystemClock()) as rescuer:
        report = rescuer.rescue_pass.run()
    assert report.pending_documents == 1
    doc = _trace(ws, "pkg-1", monkeypatch)["documents"][0]
    assert len(doc["rescues"]) == 1, doc["rescues"]
    seen = doc["rescues"][0]
    assert set(seen) == {
        "at", "rescuer", "engine", "mode", "window_end", "up_to_seq", "command_id",
    }  # fmt: skip
    assert seen["rescuer"] == settings.rescuer_name
    assert seen["engine"] == "local"
    assert seen["up_to_seq"] == doc["last_seq"] == 2
    assert seen["window_end"] == report.window_end
    text = _run(ws, "trace", "pkg-1", monkeypatch=monkeypatch)
    assert "rescue passes that commanded it" in text.stdout
    assert seen["command_id"] in text.stdout
    assert _trace(ws, "pkg-2", monkeypatch)["documents"][0]["rescues"] == []
