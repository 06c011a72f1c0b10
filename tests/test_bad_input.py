"""Wrong uses, tried as a new user would: each gives one clear line (``error: ...`` from the CLI,
one exception with a message from the library), no traceback, and loses nothing.

The table is the contract: if a message changes, the change should be deliberate. Paths in the
expected messages are the test's own temporary folders (``{ws}``, ``{tmp}``).
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox import Outbox
from outbox.app.cli import main
from outbox.core.errors import OutboxError
from tests.workspaces import dispatched_workspace

OUTBOX = str(Path(sys.executable).with_name("outbox"))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A migrated workspace holding one committed, dispatched document."""
    path = dispatched_workspace(tmp_path / "ws")
    return path


def _no_cdf_table(tmp: Path) -> None:
    import deltalake

    from outbox.delta import schema as S

    deltalake.DeltaTable.create(
        str(tmp / "nocdf"),
        schema=S.DOCUMENT_SCHEMA,
        partition_by=["bucket"],
        description=S.describe_table(1, 4, "x"),
    )


def _other_table(tmp: Path) -> None:
    import deltalake
    import pyarrow as pa

    deltalake.write_deltalake(
        str(tmp / "other"),
        pa.table({"a": [1]}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def _corrupt_checkpoint(ws: Path) -> None:
    with sqlite3.connect(ws / "outbox.db") as con:
        con.execute(
            "INSERT INTO outbox_checkpoints (table_uri, rescuer_name, version, generation, "
            "last_pass_at, updated_at, details) VALUES (?, 'default', 3, 1, "
            "'2026-01-01 00:00:00', '2026-01-01 00:00:00', '{not json')",
            (str((ws / "documents").absolute()),),
        )


def _corrupt_log_copy(ws: Path, tmp: Path) -> None:
    """A copy of the workspace's table whose first commit file is not JSON (the original stays
    intact for the nothing-lost check)."""
    import shutil

    shutil.copytree(ws / "documents", tmp / "broken")
    (tmp / "broken" / "_delta_log" / "00000000000000000000.json").write_text("{not json\n")


_DAMAGED_LOG = (
    "error: the Delta log of the table at {tmp}/broken is damaged: 00000000000000000000.json is "
    "not valid JSON (Kernel error: Json error: Encountered unexpected 'n' whilst parsing object) "
    "(fix: restore {tmp}/broken/_delta_log/00000000000000000000.json from a backup or a replica; "
    "Delta cannot rebuild its log from the data files)"
)


def _write(name: str, text: str) -> Callable[[Path, Path], object]:
    return lambda ws, tmp: (ws / name).write_text(text)


def _with_dead_letter(ws: Path, tmp: Path) -> None:
    _dead_letter(ws)


# (case id, argv after `outbox`, extra env, setup(ws, tmp), exit code, the exact stderr line)
#: ``run-gateway mqtt`` up to its options: its settings are checked before any connection.
_GATEWAY = ["-w", "{ws}", "run-gateway", "mqtt", "--destination", "devices", "--broker",
            "mqtt://127.0.0.1:1"]  # fmt: skip

CLI_CASES: list[tuple[str, list[str], dict[str, str], Any, int, str]] = [
    (
        "workspace without a table",
        ["-w", "{tmp}/nope", "status"],
        {},
        None,
        1,
        "error: no Delta table at {tmp}/nope/documents (fix: run `outbox migrate` to create it)",
    ),
    (
        "--workspace after the command",
        ["status", "--workspace", "{tmp}/nope"],
        {},
        None,
        1,
        "error: no Delta table at {tmp}/nope/documents (fix: run `outbox migrate` to create it)",
    ),
    (
        "-w after a queue subcommand",
        ["queue", "stats", "-w", "{tmp}/nope"],
        {},
        None,
        1,
        "error: the queue database {tmp}/nope/outbox.db does not exist (fix: run `outbox "
        "migrate` to create the tables)",
    ),
    (
        "demo into a workspace in use",
        ["-w", "{ws}", "demo"],
        {},
        None,
        1,
        "error: demo workspace {ws} is not an empty folder (fix: pass a new folder to "
        "-w/--workspace, or omit it for a temporary one)",
    ),
    (
        "demo -w after the command, into a workspace in use",
        ["demo", "-w", "{ws}"],
        {},
        None,
        1,
        "error: demo workspace {ws} is not an empty folder (fix: pass a new folder to "
        "-w/--workspace, or omit it for a temporary one)",
    ),
    (
        "demo devices with --packages (it has no size)",
        ["demo", "devices", "--packages", "5"],
        {},
        None,
        2,
        "error: --packages does not apply to `demo devices` (it has no size) (see `main demo "
        "--help`)",
    ),
    (
        "status on a damaged Delta log",
        ["-w", "{ws}", "status"],
        {"OUTBOX_TABLE_URI": "{tmp}/broken"},
        _corrupt_log_copy,
        1,
        _DAMAGED_LOG,
    ),
    (
        "rescue on a damaged Delta log",
        ["-w", "{ws}", "rescue"],
        {"OUTBOX_TABLE_URI": "{tmp}/broken"},
        _corrupt_log_copy,
        1,
        _DAMAGED_LOG,
    ),
    (
        "workspace is a file",
        ["-w", "{tmp}/afile", "migrate"],
        {},
        lambda ws, tmp: (tmp / "afile").write_text("x"),
        1,
        "error: workspace {tmp}/afile is a file, not a folder (fix: use --workspace DIR)",
    ),
    (
        "table without the change data feed",
        ["-w", "{ws}", "status"],
        {"OUTBOX_TABLE_URI": "{tmp}/nocdf"},
        lambda ws, tmp: _no_cdf_table(tmp),
        1,
        "error: the table at {tmp}/nocdf does not have the change data feed enabled (fix: run "
        "`outbox migrate` (or ALTER TABLE ... SET TBLPROPERTIES "
        "(delta.enableChangeDataFeed = true)))",
    ),
    (
        "schema mismatch",
        ["-w", "{ws}", "status"],
        {"OUTBOX_TABLE_URI": "{tmp}/other"},
        lambda ws, tmp: _other_table(tmp),
        1,
        "error: the table at {tmp}/other is not an outbox document table: missing column 'id'; "
        "missing column 'type'; missing column 'version'; missing column 'state'; missing column "
        "'last_seq'; missing column 'dispatched_seq'; missing column 'outbox'; missing column "
        "'updated_at'; missing column 'bucket' (fix: point the workspace at an outbox table, or "
        "migrate a new path)",
    ),
    (
        "bad duration",
        ["-w", "{ws}", "status", "--fail-if-pending-older-than", "5 minutes"],
        {},
        None,
        1,
        "error: --fail-if-pending-older-than: '5 minutes' is not a duration (fix: write it like "
        "15s, 90s, 5m, 1h or 1h30m)",
    ),
    (
        "bad poll interval",
        ["-w", "{ws}", "run-dispatcher", "--once", "--poll-interval", "fast"],
        {},
        None,
        1,
        "error: --poll-interval: 'fast' is not a duration (fix: write it like 15s, 90s, 5m, 1h "
        "or 1h30m)",
    ),
    (
        "negative vacuum retention",
        ["-w", "{ws}", "maintain", "--vacuum", "-1h"],
        {},
        None,
        1,
        "error: --vacuum: '-1h' is not a duration (fix: write it like 15s, 90s, 5m, 1h or 1h30m)",
    ),
    (
        "bad --concurrency",
        ["-w", "{ws}", "run-dispatcher", "--concurrency", "0"],
        {},
        None,
        2,
        "error: Invalid value for '--concurrency': 0 is not in the range 1<=x<=256. "
        "(see `main run-dispatcher --help`)",
    ),
    (
        "sql_url is a path",
        ["-w", "{ws}", "status"],
        {"OUTBOX_SQL_URL": "outbox.db"},
        None,
        1,
        "error: setting 'sql_url' is invalid: 'outbox.db' is not a database URL; use "
        "sqlite:///path.db or postgresql+psycopg://user@host/db",
    ),
    (
        "corrupt checkpoint",
        ["-w", "{ws}", "status"],
        {},
        lambda ws, tmp: _corrupt_checkpoint(ws),
        1,
        "error: rescuer checkpoints: the rescuer checkpoint 'default' for {ws}/documents has "
        "unreadable details "
        "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1)) (fix: run "
        "`outbox rescue --full` to sweep the table and store a fresh checkpoint)",
    ),
    (
        "rescue with an unknown engine",
        ["-w", "{ws}", "rescue", "--engine", "flink"],
        {},
        None,
        1,
        "error: --engine: 'flink' is not a rescuer engine (fix: use one of local, spark, or "
        "install the package that provides it (entry point group delta_outbox.rescuer_engines))",
    ),
    (
        "rescue with a misspelt engine",
        ["-w", "{ws}", "rescue", "--engine", "spork"],
        {},
        None,
        1,
        "error: --engine: 'spork' is not a rescuer engine (did you mean 'spark'?) (fix: use one "
        "of local, spark, or install the package that provides it (entry point group "
        "delta_outbox.rescuer_engines))",
    ),
    (
        "misspelt engine setting",
        ["-w", "{ws}", "rescue"],
        {"OUTBOX_RESCUER_ENGINE": "spork"},
        None,
        1,
        "error: setting 'rescuer_engine' is invalid: 'spork' is not a rescuer engine (did you "
        "mean 'spark'?) (fix: use one of local, spark, or install the package that provides it "
        "(entry point group delta_outbox.rescuer_engines))",
    ),
    # A duration without a unit: the same one line from every option that takes a duration.
    (
        "rescue --delay without a unit",
        ["-w", "{ws}", "rescue", "--delay", "5"],
        {},
        None,
        1,
        "error: --delay: '5' has no unit (fix: say which: 5ms, 5s, 5m or 5h)",
    ),
    (
        "status --fail-if-pending-older-than without a unit",
        ["-w", "{ws}", "status", "--fail-if-pending-older-than", "5"],
        {},
        None,
        1,
        "error: --fail-if-pending-older-than: '5' has no unit (fix: say which: 5ms, 5s, 5m or 5h)",
    ),
    (
        "maintain --vacuum without a unit",
        ["-w", "{ws}", "maintain", "--vacuum", "168"],
        {},
        None,
        1,
        "error: --vacuum: '168' has no unit (fix: say which: 168ms, 168s, 168m or 168h)",
    ),
    (
        "rescue --delay too short",
        ["-w", "{ws}", "rescue", "--delay", "5s"],
        {},
        None,
        1,
        "error: rescue delay 5s is outside 15s..1h (fix: pass --delay between 15s and 1h (for "
        "example --delay 30s))",
    ),
    (
        "rescue --every 0s (exit 1, like --delay)",
        ["-w", "{ws}", "rescue", "--every", "0s"],
        {},
        None,
        1,
        "error: --every: '0s' is not a positive duration (fix: write it like 30s, 5m or 1h)",
    ),
    (
        "rescue delay too short",
        ["-w", "{ws}", "status"],
        {"OUTBOX_RESCUE_DELAY": "5s"},
        None,
        1,
        "error: setting 'rescue_delay' is invalid: 5s is outside 15s..1h",
    ),
    (
        "inbox retention shorter than duplicate detection",
        ["-w", "{ws}", "maintain"],
        {"OUTBOX_INBOX_RETENTION": "5m"},
        None,
        1,
        "error: setting 'inbox_retention' is invalid: 300s is shorter than "
        "duplicate_detection_window (600s): the inbox drops the repeats the queue's duplicate "
        "detection lets through, so it must remember an id at least as long; e.g. 7d",
    ),
    (
        "unknown transport",
        ["-w", "{ws}", "status"],
        {"OUTBOX_TRANSPORT": "carrier-pigeon"},
        None,
        1,
        "error: setting 'transport' is invalid: 'carrier-pigeon' is not a transport (fix: use one "
        "of kafka, memory, mqtt, servicebus, sql, or install the package that provides it "
        "(entry point group delta_outbox.transports))",
    ),
    (
        "misspelt setting in outbox.toml",
        ["-w", "{ws}", "status"],
        {},
        _write("outbox.toml", '[outbox]\nrescue_dely = "30s"\n'),
        1,
        "error: unknown setting 'rescue_dely' (did you mean 'rescue_delay'?) (fix: known "
        "settings: audit_retention, buckets, checkpoint_store, claim_log, claim_log_timeout, "
        "claim_retention, "
        "command_queue, command_transport, compact_every, cosmos_checkpoint_container, "
        "cosmos_claims_container, "
        "cosmos_database, cosmos_endpoint, cosmos_inbox_container, cosmos_key, "
        "dead_letter_retention, "
        "default_destination, destinations, dispatch, duplicate_detection_window, group_commit, "
        "inbox_retention, inbox_store, kafka_bootstrap_servers, kafka_connection_string, "
        "kafka_options, "
        "kafka_partitions, kafka_sasl_mechanism, kafka_sasl_password, kafka_sasl_username, "
        "kafka_security_protocol, kafka_send_timeout, lock_duration, log_retention, "
        "max_commit_retries, max_delivery_count, "
        "max_in_flight, max_message_bytes, mqtt_broker, mqtt_topic, "
        "replay_retention, "
        "rescue_delay, rescue_interval, rescuer_engine, rescuer_name, sample_interval, "
        "sample_retention, servicebus_destinations, "
        "sql_url, "
        "storage_options, table_uri, transport, watermark_window, workspace)",
    ),
    (
        "misspelt section in outbox.toml",
        ["-w", "{ws}", "status"],
        {},
        _write("outbox.toml", '[outbx]\nrescue_delay = "30s"\n'),
        1,
        "error: settings file {ws}/outbox.toml: unknown section [outbx] (did you mean "
        "'outbox'?) (fix: put the settings under [outbox], or at the top of the file)",
    ),
    (
        "broken outbox.toml",
        ["-w", "{ws}", "status"],
        {},
        _write("outbox.toml", '[outbox\nrescue_delay = "30s"\n'),
        1,
        "error: settings file {ws}/outbox.toml is not valid TOML: Expected ']' at the end of a "
        "table declaration (at line 1, column 8)",
    ),
    (
        "missing --config file",
        ["-w", "{ws}", "--config", "{tmp}/missing.toml", "status"],
        {},
        None,
        1,
        "error: settings file {tmp}/missing.toml does not exist",
    ),
    (
        "requeue of an unknown dead-letter id",
        ["-w", "{ws}", "dead-letters", "requeue", "999"],
        {},
        None,
        1,
        "error: no dead letter has id 999 (fix: list them with `outbox dead-letters list`)",
    ),
    (
        "purge without saying which",
        ["-w", "{ws}", "dead-letters", "purge"],
        {},
        None,
        1,
        "error: say which dead letters to purge: ids, --where KEY=VALUE, or --all (exactly one) "
        "(fix: e.g. outbox dead-letters purge 12 13, purge --where reason=Timeout, or purge "
        "--all --yes)",
    ),
    (
        "requeue with two selections",
        ["-w", "{ws}", "dead-letters", "requeue", "12", "--all"],
        {},
        None,
        1,
        "error: say which dead letters to requeue: ids, --where KEY=VALUE, or --all (exactly "
        "one) (fix: e.g. outbox dead-letters requeue 12 13, requeue --where reason=Timeout, or "
        "requeue --all)",
    ),
    (
        "purge --all when stdin is not a terminal",
        ["-w", "{ws}", "dead-letters", "purge", "--all"],
        {},
        _with_dead_letter,
        1,
        "error: purge --all would delete 1 dead letter(s) for good and stdin is not a terminal "
        "to confirm it; nothing was deleted (fix: add --yes to confirm)",
    ),
    (
        "queue name with spaces",
        ["-w", "{ws}", "queue", "peek", "my queue"],
        {},
        None,
        1,
        "error: invalid queue name 'my queue' (fix: use 1-260 letters, digits, '.', '-', '_' "
        "or '/', starting and ending with a letter or digit)",
    ),
    (
        "malformed Cosmos DB key (a setting to fix, not a network problem)",
        ["-w", "{ws}", "rescue"],
        {
            "OUTBOX_CHECKPOINT_STORE": "cosmos",
            "OUTBOX_COSMOS_ENDPOINT": "https://127.0.0.1:1/",
            "OUTBOX_COSMOS_KEY": "not-base64!!",
        },
        None,
        1,
        "error: setting 'cosmos_key' is not a valid Cosmos DB account key: it is not base64 text "
        "(fix: set cosmos_key (OUTBOX_COSMOS_KEY) to the account's primary or secondary key, as "
        "the Azure portal shows it under Keys (or `az cosmosdb keys list`), or leave it empty to "
        "sign in with DefaultAzureCredential)",
    ),
    (
        "gateway retry interval longer than a queue lock",
        [*_GATEWAY, "--retry-interval", "10m"],
        {},
        None,
        1,
        "error: --retry-interval 600s must be above 0 and at most 300s (fix: a retry interval is "
        "one queue lock, and a lock lasts at most 5 minutes)",
    ),
    (
        "gateway ack group that is not one topic level",
        [*_GATEWAY, "--ack-group", "a/b"],
        {},
        None,
        1,
        "error: --ack-group 'a/b' is not one topic level (fix: letters, digits, '-', '_' and '.', "
        "without '/', '+' or '#')",
    ),
    (
        "gateway status topic equal to its ack topic",
        [*_GATEWAY, "--status-topic", "devices/{session}/tasks/ack"],
        {},
        None,
        1,
        "error: --topic, --ack-topic and --status-topic must differ (fix: e.g. "
        "devices/{session}/tasks, devices/{session}/tasks/ack and devices/{session}/status)",
    ),
]


def _dead_letter(ws: Path, message_id: str = "poison") -> None:
    from dispatcher.queue import QueueMessage, SqlQueue

    with SqlQueue(f"sqlite:///{ws / 'outbox.db'}") as queue:
        queue.send("shipments", QueueMessage(body=b"{}", message_id=message_id))
        [msg] = queue.receive("shipments", 1)
        queue.dead_letter(msg, "Poison", "cannot be handled")


def _dead_letters_left(ws: Path) -> int:
    from dispatcher.queue import SqlQueue

    with SqlQueue(f"sqlite:///{ws / 'outbox.db'}") as queue:
        return queue.count_dead_letters(all=True)


def _fmt(value: str, ws: Path, tmp: Path) -> str:
    return value.replace("{ws}", str(ws)).replace("{tmp}", str(tmp))


@pytest.mark.parametrize(
    ("argv", "env", "setup", "code", "expected"),
    [pytest.param(*c[1:], id=c[0]) for c in CLI_CASES],
)
def test_cli_wrong_use(
    ws: Path,
    tmp_path: Path,
    *,
    argv: list[str],
    env: dict[str, str],
    setup: Any,
    code: int,
    expected: str,
) -> None:
    if setup is not None:
        setup(ws, tmp_path)
    result = CliRunner().invoke(
        main,
        [_fmt(a, ws, tmp_path) for a in argv],
        env={k: _fmt(v, ws, tmp_path) for k, v in env.items()},
    )
    assert isinstance(result.exception, SystemExit | None), result.exception
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.stderr.splitlines() if not ln[:4].isdigit()]  # drop log lines
    assert lines == [_fmt(expected, ws, tmp_path)]
    assert "Traceback" not in result.output
    (ws / "outbox.toml").unlink(missing_ok=True)
    _still_there(ws)
    if setup is _with_dead_letter:
        assert _dead_letters_left(ws) == 1


def _still_there(ws: Path) -> None:
    """Nothing lost: the committed document is intact and dispatched."""
    with Outbox.open(ws, transport="memory", create=False) as ob:
        _, rows = ob.store.read(["pkg-1"])
        assert rows["pkg-1"].last_seq == rows["pkg-1"].dispatched_seq == 1


# --- the library ------------------------------------------------------------------------------


def _save(ob: Outbox, doc_id: str, body: Any, **send: Any) -> None:
    with ob.unit_of_work() as uow:
        doc = uow.create(doc_id, type="Package")
        doc.state["touched"] = True
        doc.send("StatusChanged", body, **send)


def _save_declared(ob: Outbox, destination: str) -> None:
    with Outbox.open(
        ob.settings.workspace, transport="memory", destinations=("shipments", "returns")
    ) as declared:
        _save(declared, "pkg-2", {"a": 1}, destination=destination)


LIBRARY_CASES: list[tuple[str, Callable[[Outbox], Any], str, str]] = [
    (
        "misspelt declared destination",
        lambda ob: _save_declared(ob, "shipmnets"),
        "ValidationError",
        "destination 'shipmnets' is not declared (did you mean 'shipments'?); nothing was "
        "written (fix: send to one of returns, shipments, or add it to the destinations setting "
        "(OUTBOX_DESTINATIONS))",
    ),
    (
        "message too large",
        lambda ob: _save(ob, "pkg-2", "x" * 300_000, destination="shipments"),
        "MessageTooLargeError",
        "message 'StatusChanged' for 'shipments' is 300060 bytes; the limit is 262144 (fix: send "
        "a reference to the data instead, or raise max_message_bytes)",
    ),
    (
        "missing destination",
        lambda ob: _save(ob, "pkg-2", {"a": 1}),
        "ValidationError",
        "destination must be a non-empty queue or topic name, got None (fix: pass "
        'destination="shipments" (or set a default destination))',
    ),
    (
        "empty document id",
        lambda ob: _save(ob, "", {"a": 1}, destination="shipments"),
        "ValidationError",
        "document id must be a non-empty string, got ''",
    ),
    (
        "body that is not JSON",
        lambda ob: _save(ob, "pkg-2", {"when": object()}, destination="shipments"),
        "SerializationError",
        "message 'StatusChanged' body cannot be serialized to JSON: Object of type object is not "
        "JSON serializable (fix: use dicts, lists, strings, numbers, booleans and None (convert "
        "dates to text))",
    ),
    (
        "creating a document that exists",
        lambda ob: _save(ob, "pkg-1", {"a": 1}, destination="shipments"),
        "ConcurrencyError",
        "document 'pkg-1' already exists; nothing was written (fix: change it "
        "through uow.get('pkg-1'), or create it under a new id)",
    ),
    (
        "unknown rescuer engine",
        lambda ob: ob.backends.rescuer_engine("flink"),
        "ConfigurationError",
        "setting 'rescuer_engine' is invalid: 'flink' is not a rescuer engine (fix: use one of "
        "local, spark, or install the package that provides it (entry point group "
        "delta_outbox.rescuer_engines))",
    ),
    (
        "invalid setting value",
        lambda ob: Outbox.open(ob.settings.workspace, max_in_flight=0),
        "ConfigurationError",
        "setting 'max_in_flight' is invalid: 0; must be a positive integer",
    ),
]


@pytest.mark.parametrize(
    ("action", "error", "message"), [pytest.param(*c[1:], id=c[0]) for c in LIBRARY_CASES]
)
def test_library_wrong_use(
    ws: Path, action: Callable[[Outbox], Any], error: str, message: str
) -> None:
    with Outbox.open(ws, transport="memory", default_destination=None) as ob:
        version = ob.store.version()
        with pytest.raises(OutboxError) as caught:
            action(ob)
        assert type(caught.value).__name__ == error
        assert str(caught.value) == message
        assert ob.store.refresh() == version  # nothing was written
    _still_there(ws)


def test_disk_full_during_a_save_is_one_clear_error(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated ENOSPC (tests run as root here, so chmod cannot make a folder read-only)."""
    with Outbox.open(ws, transport="memory") as ob:

        def full(*_a: Any, **_k: Any) -> Any:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(ob.store, "_append_documents", full)
        with pytest.raises(OutboxError) as caught:
            _save(ob, "pkg-2", {"a": 1}, destination="shipments")
        assert str(caught.value) == (
            f"saving to {ws.absolute()}/documents failed: [Errno 28] No space left on device"
        )
        monkeypatch.undo()
        _save(ob, "pkg-2", {"a": 1}, destination="shipments")  # space is back: it works
    _still_there(ws)


def test_ctrl_c_during_a_rescue_pass_keeps_the_checkpoint(ws: Path) -> None:
    """Ctrl-C while enqueueing: the checkpoint does not move, so the next pass redoes the window
    and the queue's duplicate detection drops what was already enqueued."""
    from datetime import timedelta

    from outbox.core.clock import SystemClock
    from outbox.testing.faulty import FaultySink
    from rescuer.cdf_local import LocalEngine
    from rescuer.checkpoint import InMemoryCheckpointStore
    from rescuer.runner import RescuePass

    class Later(SystemClock):
        def now(self) -> Any:
            return super().now() + timedelta(minutes=5)

    with Outbox.open(ws, transport="memory", dispatch="deferred") as ob:
        _save(ob, "pkg-2", {"a": 1}, destination="shipments")  # deferred: left pending
        sink, checkpoints = FaultySink(), InMemoryCheckpointStore()
        rescuer = RescuePass(ob.store, LocalEngine(), checkpoints, sink, clock=Later())
        sink.fail_next = KeyboardInterrupt()
        with pytest.raises(KeyboardInterrupt):
            rescuer.run()
        assert checkpoints.read(ob.store.uri, "default") is None
        report = rescuer.run()
        assert [c.id for c in sink.commands] == ["pkg-2"]
        assert report.checkpoint_after == ob.store.version()


def test_ctrl_c_in_any_command_is_one_line(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_a: Any, **_k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("outbox.app.status.collect_status", interrupted)
    result = CliRunner().invoke(main, ["-w", str(ws), "status"])
    assert result.exit_code == 130
    assert result.stderr.strip() == (
        "interrupted: stopped before finishing; nothing committed was lost"
    )


# --- real processes: what a user's terminal shows ----------------------------------------------


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OUTBOX, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )


def test_real_process_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    missing = _run("-w", str(tmp_path / "nope"), "status")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"error: no Delta table at {tmp_path}/nope/documents (fix: run `outbox migrate` to "
        "create it)"
    )
    bad = _run("-w", str(tmp_path), "run-dispatcher", "--concurrency", "zero")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "error: Invalid value for '--concurrency': 'zero' is not a valid integer range. "
        "(see `outbox run-dispatcher --help`)"
    )
    assert "Traceback" not in missing.stderr + bad.stderr


def test_a_misspelt_variable_is_warned_about_in_a_real_process(ws: Path) -> None:
    """... and ``--quiet`` leaves only warnings on stderr (the worker's INFO lines go)."""
    result = _run("-q", "-w", str(ws), "run-dispatcher", "--once", OUTBOX_RESCUE_DELY="30s")
    assert result.returncode == 0, result.stderr
    assert [ln.split(" ", 2)[2] for ln in result.stderr.splitlines()] == [
        "WARNING outbox.settings: ignoring the environment variable OUTBOX_RESCUE_DELY: no "
        "setting has that name (did you mean 'OUTBOX_RESCUE_DELAY'?)"
    ]


@pytest.mark.slow
def test_second_migrate_while_a_worker_runs(ws: Path) -> None:
    """Decided behaviour: ``migrate`` is idempotent and takes no exclusive lock, so running it
    next to live workers is safe; it says there was nothing to do, and the worker carries on."""
    worker = subprocess.Popen(
        [OUTBOX, "-w", str(ws), "run-dispatcher", "--poll-interval", "50ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        line = worker.stderr.readline()  # the start-up line: the worker is running
        assert "run-dispatcher" in line, line
        again = _run("-w", str(ws), "migrate")
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == (
            f"already up to date: {ws.absolute()}/documents and sqlite:///{ws.absolute()}/outbox.db"
        )
        assert worker.poll() is None  # still running
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "Traceback" not in err
    _still_there(ws)


def test_status_still_shows_the_queues_when_a_checkpoint_is_corrupt(ws: Path) -> None:
    from dispatcher.queue import QueueMessage, SqlQueue

    with SqlQueue(f"sqlite:///{ws / 'outbox.db'}") as queue:
        queue.send("shipments", QueueMessage(body=b"{}", message_id="m-1"))
    _corrupt_checkpoint(ws)
    result = CliRunner().invoke(main, ["-w", str(ws), "status", "--json"])
    assert result.exit_code == 1
    import json

    report = json.loads(result.stdout)
    assert report["pending_documents"] == 0
    assert [p.split(":")[0] for p in report["problems"]] == ["rescuer checkpoints"]
    [depth] = report["queues"]
    assert (depth["queue"], depth["active"]) == ("shipments", 1)


_BLOCK_IN_A_PASS = """
import signal, sys
from datetime import timedelta

import outbox.app.cli.rescue as rescue_cli
from outbox.core.clock import SystemClock
from rescuer.cdf_local import LocalEngine


class Later(SystemClock):  # every commit is old enough for the delay
    def now(self):
        return super().now() + timedelta(minutes=5)


def blocked(self, uri, version):
    sys.stderr.write("sweeping\\n")
    sys.stderr.flush()
    signal.pause()  # the test's SIGINT raises KeyboardInterrupt here, mid-pass
    raise AssertionError("not interrupted")


rescue_cli.SystemClock = Later
LocalEngine.plan_sweep = blocked
# Ctrl-C as in a terminal: a process started under pytest-xdist inherits SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
from outbox.app.cli import main

main(["-w", sys.argv[1], "rescue"], prog_name="outbox")
"""


@pytest.mark.slow
def test_real_sigint_during_a_rescue_pass(ws: Path) -> None:
    """Ctrl-C in a terminal, in the middle of a pass: one line, exit 130, checkpoint untouched."""
    from rescuer.checkpoint import SqlCheckpointStore

    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCK_IN_A_PASS, str(ws)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "sweeping\n"  # inside the pass, before any checkpoint
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines() == [
        "interrupted: the pass stopped before storing its checkpoint; the next pass repeats the "
        "same window and the queue drops the commands already enqueued"
    ]
    assert out == ""
    checkpoints = SqlCheckpointStore(f"sqlite:///{ws.absolute()}/outbox.db")
    try:
        assert checkpoints.list() == []
    finally:
        checkpoints.close()
    _still_there(ws)


def test_unreachable_database_names_each_unreadable_part(ws: Path) -> None:
    """``status`` reports every part it could not read, one line each, and still exits 1.
    (The queue's own wording belongs to the queue; only the part names are pinned here.)"""
    url = "postgresql+psycopg://nobody@127.0.0.1:1/outbox"
    result = CliRunner().invoke(main, ["-w", str(ws), "status"], env={"OUTBOX_SQL_URL": url})
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.stderr.splitlines() if not ln[:4].isdigit()]
    assert [ln.split(":")[1].strip() for ln in lines] == ["rescuer checkpoints", "queues"]
    assert all(ln.startswith("error: ") and url in ln for ln in lines)
    assert lines[0] == (
        f"error: rescuer checkpoints: listing rescuer checkpoints: the database {url} failed: "
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection '
        "refused (fix: check that the database is reachable, then retry the pass)"
    )
    assert "Traceback" not in result.output
    _never_all_clear(result.stdout)


def _never_all_clear(stdout: str) -> None:
    """The text of a status that could not read the SQL side says so, and shows no empty tables
    that would read as all clear."""
    assert "not read           rescuer checkpoints, queues" in stdout.splitlines()
    assert "(no rescue pass yet)" not in stdout
    assert "(empty)" not in stdout
    assert stdout.count("(could not read: see the error below)") == 2


def test_status_text_with_a_corrupt_queue_database_is_not_all_clear(ws: Path) -> None:
    (ws / "outbox.db").rename(ws / "outbox.db.good")
    (ws / "outbox.db").write_text("garbage\n")
    try:
        result = CliRunner().invoke(main, ["-w", str(ws), "status"])
        assert result.exit_code == 1, result.output
        _never_all_clear(result.stdout)
        lines = [ln for ln in result.stderr.splitlines() if not ln[:4].isdigit()]
        assert [ln.split(":")[1].strip() for ln in lines] == ["rescuer checkpoints", "queues"]
        as_json = CliRunner().invoke(main, ["-w", str(ws), "status", "--json"])
        assert as_json.exit_code == 1
        import json

        problems = json.loads(as_json.stdout)["problems"]
        assert [p.split(":")[0] for p in problems] == ["rescuer checkpoints", "queues"]
    finally:
        (ws / "outbox.db.good").replace(ws / "outbox.db")
    _still_there(ws)


def test_purge_all_asks_on_a_terminal_and_takes_yes(ws: Path) -> None:
    """A real terminal on stdin (a pty): "n" deletes nothing, "y" deletes; ``-y`` (no terminal
    here) never asks. The prompt goes to stderr, stdout keeps the result."""
    import pty

    def purge(answer: str) -> subprocess.CompletedProcess[str]:
        argv = [OUTBOX, "-w", str(ws), "dead-letters", "purge", "--all"]
        leader, follower = pty.openpty()
        try:
            os.write(leader, answer.encode() + b"\n")
            return subprocess.run(
                argv, stdin=follower, capture_output=True, text=True, timeout=60, check=False
            )
        finally:
            os.close(leader)
            os.close(follower)

    _dead_letter(ws)
    no = purge("n")
    assert (no.returncode, no.stdout) == (1, ""), no.stderr
    assert no.stderr == (
        "delete all 1 dead letter(s) for good? [y/N]: "
        "error: purge --all not confirmed; nothing was deleted\n"
    )
    assert _dead_letters_left(ws) == 1
    yes = purge("y")
    assert (yes.returncode, yes.stdout) == (0, "purged 1 dead letter(s)\n"), yes.stderr
    assert _dead_letters_left(ws) == 0
    _dead_letter(ws, "poison-2")
    scripted = CliRunner().invoke(main, ["-w", str(ws), "dead-letters", "purge", "--all", "-y"])
    assert (scripted.exit_code, scripted.stdout) == (0, "purged 1 dead letter(s)\n")
    assert _dead_letters_left(ws) == 0
    _still_there(ws)
