"""Source-level mutation proofs: removing a guard must fail the test that owns it (issue 29).

Each row below removes one mechanism from the production source, the way the issue's scratch-copy
runs did, and requires the test that owns the mechanism to fail on the assertion named in the
row. How, and why this way: the one function holding the mechanism is recompiled from its own
source with the edit applied and patched onto its class for the duration of the run (in process:
no copy of the tree, no second pytest), then the owning test function is called with the fixtures
it declares. Every owner must pass on the intact code, so a row cannot pass because its owner
broke for another reason: ``test_the_recompiled_function_is_the_original_when_nothing_is_edited``
runs each once, on its function recompiled without an edit (which also proves the recompiling
changes nothing), rather than each row running its owner twice; and a row checks its owner failed
on the line it names. Each edit must match the source exactly once, so a row that no longer
applies fails here instead of silently testing nothing.

The end-to-end checker's broken builds are another set (``outbox.app.checker.mutations``, run by
``tests/e2e/test_checker_mutations.py``); these are the cheap ones, a second or so each.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue.key_lines import MemoryKeyLines
from outbox.core.clock import ManualClock
from outbox.testing.contracts.rescuer_engine import DELAY
from outbox.testing.tables import Table
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.runner import RescuePass
from rescuer.sink import InMemorySink
from tests import test_trace_cli, test_trace_index
from tests.console import test_console_operators, test_console_session
from tests.console.conftest import ConsoleWorkspace, console_client, console_workspace
from tests.dispatcher import (
    test_dispatch_fast_path,
    test_kafka_delivery_reports,
    test_key_order,
    test_transport_capabilities,
)
from tests.mqtt import test_places
from tests.mutate import CHILD, failing_line, mutated
from tests.queue import (
    test_batch_completion,
    test_fresh_schema,
    test_inbox_pruning,
    test_receive_size,
    test_selection,
    test_unique_ids,
)
from tests.rescuer import test_contract
from tests.write_path import (
    test_delete,
    test_file_ids,
    test_one_maintainer,
    test_save_guards,
    test_table_state,
    test_versions,
)
from tests.write_path.conftest import bare_outbox


def _with_outbox(test: Callable[[Any], None]) -> Callable[[Path], None]:
    """Run a write-path test (``ob`` fixture) on a fresh bare outbox."""

    def run(tmp_path: Path) -> None:
        ob = bare_outbox(tmp_path / "ws", ManualClock())
        try:
            test(ob)
        finally:
            ob.close()

    return run


def _in_workspace(test: Callable[[Path], None]) -> Callable[[Path], None]:
    """Run a test that takes the ``workspace`` fixture."""

    def run(tmp_path: Path) -> None:
        test(tmp_path / "ws")

    return run


def _with_rescuer(name: str) -> Callable[[Path], None]:
    """Run a rescuer-engine contract test on the local engine (its fixtures built as the
    contract's own fixtures build them)."""

    def run(tmp_path: Path) -> None:
        contract = test_contract.TestLocalEngine()
        table = Table(tmp_path / "documents")
        sink, clock = InMemorySink(), ManualClock()
        rescuer = RescuePass(
            table.store,
            contract.make_engine(),
            InMemoryCheckpointStore(),
            sink,
            clock=clock,
            delay=DELAY,
        )
        getattr(contract, name)(table=table, rescuer=rescuer, sink=sink, clock=clock)

    return run


def _with_console(test: Callable[[ConsoleWorkspace], None]) -> Callable[[Path], None]:
    """Run a console test (``console_ws`` fixture) on a fresh console workspace on SQLite."""

    def run(tmp_path: Path) -> None:
        tmp_path.mkdir(parents=True)
        test(console_workspace(tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}"))

    return run


def _with_console_client(test: Callable[[Any, ConsoleWorkspace], None]) -> Callable[[Path], None]:
    """Run a console test taking (``client``, ``console_ws``) on a fresh SQLite workspace."""

    def run(tmp_path: Path) -> None:
        tmp_path.mkdir(parents=True)
        ws = console_workspace(tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}")
        for client in console_client(ws):
            test(client, ws)

    return run


def _on_sqlite(test: Callable[[str], None]) -> Callable[[Path], None]:
    """Run a test that takes the ``sql_url`` fixture on a SQLite file (its mechanism is
    SQLite's)."""

    def run(tmp_path: Path) -> None:
        tmp_path.mkdir(parents=True)
        test(f"sqlite:///{tmp_path / 'outbox.db'}")

    return run


def _with_queue(
    test: Callable[..., None], *, clock: bool = False, by_revisions: bool = False
) -> Callable[[Path], None]:
    """Run a queue test (``queue`` fixture, and ``clock`` when asked: the queue's) on a SQLite
    queue migrated as the fixture does, or ``by_revisions``: through every revision, where a
    revision's mechanism runs (a new database is otherwise created at the head)."""

    def run(tmp_path: Path) -> None:
        from dispatcher.queue.sql_queue import SqlQueue
        from migrations.sql import upgrade

        tmp_path.mkdir(parents=True)
        url = f"sqlite:///{tmp_path / 'outbox.db'}"
        if by_revisions:
            test_fresh_schema.by_revisions(url)
        else:
            upgrade(url)
        queue = SqlQueue(url, clock=ManualClock(), max_delivery_count=3, max_body_bytes=1024)
        try:
            test(queue, queue.clock) if clock else test(queue)
        finally:
            queue.close()

    return run


def _pruning(name: str) -> Callable[[Path], None]:
    """Run an inbox pruning contract test on the SQL inbox of a SQLite queue."""

    def run(queue: Any) -> None:
        contract = test_inbox_pruning.TestSqlInboxPruning()
        contract.queue = queue
        getattr(contract, name)()

    return _with_queue(run)


def _with_monkeypatch(test: Callable[..., None]) -> Callable[[Path], None]:
    """Run a test that takes ``tmp_path``, ``monkeypatch`` and ``caplog``."""

    def run(tmp_path: Path) -> None:
        import logging

        tmp_path.mkdir(parents=True)
        handler = _Records()
        logging.getLogger().addHandler(handler)
        try:
            with pytest.MonkeyPatch.context() as patch:
                handler.patch = patch
                test(tmp_path, patch, handler)
        finally:
            logging.getLogger().removeHandler(handler)

    return run


class _Records(logging.Handler):
    """What ``caplog`` gives a test: the records, and ``set_level``."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.patch: pytest.MonkeyPatch | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def set_level(self, level: int, logger: str) -> None:
        assert self.patch is not None  # put back with the test's other patches
        self.patch.setattr(logging.getLogger(logger), "level", level)


@dataclass(frozen=True)
class SourceMutation:
    name: str
    target: str  # "module:Class.method" or "module:function": the one function edited
    edits: tuple[tuple[str, str], ...]  # (exact source text, its replacement)
    owner: str  # the owning test's node id
    run_owner: Callable[[Path], None]
    failing_line: str  # a fragment of the owner's source line that must fail


def _plain(test: Callable[[], None]) -> Callable[[Path], None]:
    """Run a test that takes no fixture."""
    return lambda _tmp_path: test()


def _patching(test: Callable[[Path, pytest.MonkeyPatch], None]) -> Callable[[Path], None]:
    """Run a test that takes ``tmp_path`` and ``monkeypatch`` (undone when it returns)."""

    def run(tmp_path: Path) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        with pytest.MonkeyPatch.context() as patch:
            test(tmp_path, patch)

    return run


def _sharing_lines(test: Callable[[Callable[[], Any]], None]) -> Callable[[Path], None]:
    """Run a key-order test that takes ``shared_lines`` on one store in memory (two dispatchers
    standing for two processes)."""

    def run(_tmp_path: Path) -> None:
        one = MemoryKeyLines()
        test(lambda: one)

    return run


def _sharing_sqlite_lines(test: Callable[[Callable[[], Any]], None]) -> Callable[[Path], None]:
    """Run a key-order test that takes ``shared_lines`` on one SQLite file, a connection per
    dispatcher (two processes sharing the queue's database)."""

    def run(tmp_path: Path) -> None:
        tmp_path.mkdir(parents=True)
        with test_key_order.sqlite_shared_lines(tmp_path) as make:
            test(make)

    return run


MUTATIONS = [
    SourceMutation(
        "a document reads its newest row's watermark, not its life's highest (mark rows lost)",
        "outbox.delta.current:current_rows",
        (("if latest.num_rows == keyed.num_rows:", "if True:"),),
        "tests/write_path/test_versions.py::"
        "test_a_document_is_its_newest_version_with_its_lifes_highest_watermark",
        _with_outbox(
            test_versions.test_a_document_is_its_newest_version_with_its_lifes_highest_watermark
        ),
        'assert (rows["a"].version, rows["a"].dispatched_seq, rows["a"].last_seq) == (2, 1, 2)',
    ),
    SourceMutation(
        "a save appends without its per-document application transactions",
        "outbox.delta.store:DeltaDocumentStore._append_documents",
        (("documents=[(w.row.id, w.row.version) for w in writes],", "documents=[],"),),
        "tests/write_path/test_versions.py::"
        "test_two_saves_of_one_document_from_one_snapshot_one_wins",
        _in_workspace(test_versions.test_two_saves_of_one_document_from_one_snapshot_one_wins),
        'assert sorted(type(e).__name__ for e in errors) == ["ConcurrencyError", "NoneType"]',
    ),
    SourceMutation(
        "a save's application transactions carry the time of the save (a day in every checkpoint)",
        "outbox.delta.appends:append",
        (("last_updated=EXPIRED_MS", "last_updated=int(datetime.now().timestamp() * 1000)"),),
        "tests/write_path/test_table_state.py::"
        "test_a_checkpoint_holds_no_transaction_of_a_save_however_many",
        _with_outbox(
            test_table_state.test_a_checkpoint_holds_no_transaction_of_a_save_however_many
        ),
        'assert [t["appId"] for t in txns if t["appId"].startswith(TXN_PREFIX)] == []',
    ),
    SourceMutation(
        "the file id index claims every id absent",
        "outbox.delta.file_ids:FileIds._maybe_present",
        (("return [i for i, h in zip(ids, hit, strict=True) if h]", "return []"),),
        "tests/write_path/test_file_ids.py::"
        "test_a_create_of_an_id_another_writer_created_fails_with_a_warm_index",
        _in_workspace(
            test_file_ids.test_a_create_of_an_id_another_writer_created_fails_with_a_warm_index
        ),
        "with pytest.raises(ConcurrencyError):",
    ),
    SourceMutation(
        "the file id index notes an append's files without the ids it wrote",
        "outbox.delta.file_ids:FileIds.wrote",
        (("held = np.unique(_hashes(mine))", "held = np.unique(_hashes(mine[:0]))"),),
        "tests/write_path/test_file_ids.py::"
        "test_the_stores_own_appends_are_noted_not_read_back_and_still_found",
        _in_workspace(
            test_file_ids.test_the_stores_own_appends_are_noted_not_read_back_and_still_found
        ),
        "with pytest.raises(ConcurrencyError):",
    ),
    SourceMutation(
        "the file id index notes files an append did not write",
        "outbox.delta.file_ids:FileIds.wrote",
        (("if int(dt.version()) != before + 1:", "if False:"),),
        "tests/write_path/test_file_ids.py::test_nothing_is_noted_when_another_commit_came_between",
        _in_workspace(test_file_ids.test_nothing_is_noted_when_another_commit_came_between),
        "assert index.files_noted == noted",
    ),
    SourceMutation(
        "a save racing another save of its document commits without the transactions",
        "outbox.delta.store:DeltaDocumentStore._append_documents",
        (("documents=[(w.row.id, w.row.version) for w in writes],", "documents=[],"),),
        "tests/write_path/test_table_state.py::"
        "test_a_save_racing_another_save_of_its_document_loses_across_a_checkpoint",
        _in_workspace(
            test_table_state.test_a_save_racing_another_save_of_its_document_loses_across_a_checkpoint
        ),
        'with pytest.raises(ConcurrencyError, match="was changed since it was read"):',
    ),
    SourceMutation(
        "the table is created with Delta's week of tombstones",
        "outbox.delta.table:create_table",
        (("**S.STATE_PROPERTIES", "S.TXN_RETENTION_PROPERTY: S.TXN_RETENTION"),),
        "tests/write_path/test_table_state.py::"
        "test_a_tombstone_older_than_the_retention_leaves_the_checkpoint",
        _in_workspace(
            test_table_state.test_a_tombstone_older_than_the_retention_leaves_the_checkpoint
        ),
        'assert kept == ["bucket=0/young.parquet"]',
    ),
    SourceMutation(
        "a save that claims the current snapshot skips the check of its expected version",
        "outbox.delta.seen:SeenReads.covers",
        (("if found is None or found[0] != w.expected_version:", "if found is None:"),),
        "tests/write_path/test_save_guards.py::"
        "test_a_stale_expected_version_on_a_current_snapshot_raises_and_writes_nothing",
        _with_outbox(
            test_save_guards.test_a_stale_expected_version_on_a_current_snapshot_raises_and_writes_nothing
        ),
        "with pytest.raises(ConcurrencyError):",
    ),
    SourceMutation(
        "the rescuer plans the feed up to the newest version, not the window's end",
        "rescuer.runner:RescuePass._run",
        (("FeedWindow(before, end.end, latest)", "FeedWindow(before, latest, latest)"),),
        "tests/rescuer/test_contract.py::TestLocalEngine::"
        "test_the_window_ends_at_the_newest_version_old_enough",
        _with_rescuer("test_the_window_ends_at_the_newest_version_old_enough"),
        'assert _ids(sink) == [("old", 1)]',
    ),
    SourceMutation(
        "the fold deletes superseded versions without raising the kept row's watermark",
        "outbox.delta.fold:fold_merge",
        (("predicate=\"s._fold = 'raise'\",", "predicate=\"s._fold = 'never'\","),),
        "tests/write_path/test_versions.py::"
        "test_the_fold_removes_superseded_versions_and_changes_no_document",
        _with_outbox(
            test_versions.test_the_fold_removes_superseded_versions_and_changes_no_document
        ),
        "assert report.watermarks_raised == 1",
    ),
    SourceMutation(
        "the planner takes a document's life from mark rows too",
        "rescuer.cdf_local:documents",
        (('docs = posts.filter(pc.greater(posts["version"], MARK_VERSION))', "docs = posts"),),
        "tests/rescuer/test_contract.py::TestLocalEngine::"
        "test_a_late_mark_of_a_deleted_life_hides_no_document",
        _with_rescuer("test_a_late_mark_of_a_deleted_life_hides_no_document"),
        'assert _ids(sink) == [("a", 1)]',
    ),
    SourceMutation(
        "the planner reads a bucket's rewrite (a delete and an insert in one commit) as an end",
        "rescuer.cdf_local:documents",
        (
            (
                'pc.greater(hit["_commit_version"], hit["_commit"]),',
                'pc.greater_equal(hit["_commit_version"], hit["_commit"]),',
            ),
        ),
        "tests/rescuer/test_contract.py::TestLocalEngine::"
        "test_a_bucket_rewritten_in_one_commit_keeps_its_pending_documents",
        _with_rescuer("test_a_bucket_rewritten_in_one_commit_keeps_its_pending_documents"),
        'assert _ids(sink) == [("p", 2)]',
    ),
    SourceMutation(
        "the planner takes a document's newest change, not its newest version",
        "rescuer.cdf_local:documents",
        (
            (
                'ours.sort_by([("version", "ascending"), ("_commit_version", "ascending")])',
                'ours.sort_by([("_commit_version", "ascending"), ("version", "ascending")])',
            ),
        ),
        "tests/rescuer/test_contract.py::TestLocalEngine::"
        "test_a_later_mark_row_hides_no_newer_message",
        _with_rescuer("test_a_later_mark_row_hides_no_newer_message"),
        'assert _ids(sink) == [("a", 2)]',
    ),
    SourceMutation(
        "the console's actions trust a cookie that names a session, not its server-side registry",
        "outbox.app.console.security:check_action",
        (
            ("if unlocked is None:", "if unlocked is None and not session.get(SESSION_ID):"),
            (
                'if unlocked.role != "operator":',
                'if unlocked is not None and unlocked.role != "operator":',
            ),
        ),
        "tests/console/test_console_session.py::"
        "test_a_copy_of_the_cookie_taken_before_lock_is_refused_after_it",
        _with_console(
            test_console_session.test_a_copy_of_the_cookie_taken_before_lock_is_refused_after_it
        ),
        "assert refused.status_code == 403, path",
    ),
    SourceMutation(
        "the trace reads a commit's rewritten files as its changes, not its change files",
        "outbox.delta.change_files:changed_files",
        (("    if cdc:\n", "    if False:\n"),),
        "tests/test_trace_index.py::test_the_indexed_history_is_the_feeds_history",
        test_trace_index.test_the_indexed_history_is_the_feeds_history,
        "assert indexed == fed, d",
    ),
    SourceMutation(
        "the commit index keeps no change row's messages",
        "outbox.app.trace.index:_entries",
        (('shown = change != "delete" and int(doc_version) > 0', "shown = False"),),
        "tests/test_trace_index.py::test_the_indexed_history_is_the_feeds_history",
        test_trace_index.test_the_indexed_history_is_the_feeds_history,
        "assert indexed == fed, d",
    ),
    SourceMutation(
        "the commit index's search finds no message",
        "outbox.app.trace.index:CommitIndex.find",
        (("M.c.last_version >= first", "M.c.last_version < first"),),
        "tests/test_trace_index.py::"
        "test_a_folded_message_is_found_by_its_id_in_the_index_not_the_feed",
        _patching(
            test_trace_index.test_a_folded_message_is_found_by_its_id_in_the_index_not_the_feed
        ),
        'pytest.fail(f"the index did not find {q}: {e}")',
    ),
    SourceMutation(
        "a rescue pass writes nothing in its journal",
        "rescuer.runner:RescuePass._run",
        (("self._record(commands, mode, end.end, now, warnings)", "None"),),
        "tests/test_trace_cli.py::test_a_rescue_pass_that_commanded_the_document_is_in_its_trace",
        _patching(
            lambda tmp_path, patch: (
                test_trace_cli.test_a_rescue_pass_that_commanded_the_document_is_in_its_trace(
                    test_trace_cli.trace_workspace(tmp_path / "ws", f"sqlite:///{tmp_path}/o.db"),
                    patch,
                )
            )
        ),
        'assert len(doc["rescues"]) == 1, doc["rescues"]',
    ),
    SourceMutation(
        "a read-only trace reads the feed though the index is caught up",
        "outbox.app.trace.timeline:_caught_up",
        (("if (index.indexed_to() or -1) >= latest:", "if False:"),),
        "tests/test_trace_index.py::"
        "test_a_read_only_database_uses_the_index_another_trace_caught_up",
        _patching(
            test_trace_index.test_a_read_only_database_uses_the_index_another_trace_caught_up
        ),
        'raise AssertionError("the feed was read")',
    ),
    SourceMutation(
        "the commit index's catch-up skips the first commit after its cursor",
        "outbox.app.trace.index:CommitIndex.catch_up",
        (("max(oldest, cursor + 1)", "max(oldest, cursor + 2)"),),
        "tests/test_trace_index.py::"
        "test_the_index_catches_up_with_later_commits_and_forgets_trimmed_ones",
        test_trace_index.test_the_index_catches_up_with_later_commits_and_forgets_trimmed_ones,
        'assert after == _trace(ob, "b", use_index=False)',
    ),
    SourceMutation(
        "a revoked operator's console session goes on acting",
        "outbox.app.console.access:register",
        (
            (
                "if unlocked is not None and unlocked.named and not operators.is_active(",
                "if False and (",
            ),
        ),
        "tests/console/test_console_operators.py::"
        "test_an_operator_acts_under_their_name_and_a_revoked_session_ends",
        _with_console_client(
            test_console_operators.test_an_operator_acts_under_their_name_and_a_revoked_session_ends
        ),
        'assert \'id="mode" href="/unlock">locked\' in page',
    ),
    SourceMutation(
        "a read-only operator's token may act",
        "outbox.app.console.security:check_action",
        (('if unlocked.role != "operator":', "if False:"),),
        "tests/console/test_console_operators.py::test_a_read_only_operator_may_not_act",
        _with_console_client(test_console_operators.test_a_read_only_operator_may_not_act),
        "assert r.status_code == 403",
    ),
    SourceMutation(
        "the gateway's free places go to the oldest tasks in the line, not the first ready",
        "dispatcher.mqtt.places:Places.choose",
        (
            (
                "order = sorted(ready, key=lambda r: (self.ready_since(r[0], now), "
                "r[0].sequence_number))",
                "order = list(ready)",
            ),
        ),
        "tests/mqtt/test_places.py::"
        "test_a_place_goes_to_the_task_ready_first_not_to_the_oldest_in_the_line",
        _plain(test_places.test_a_place_goes_to_the_task_ready_first_not_to_the_oldest_in_the_line),
        'assert [m.session_id for m, _ in chosen] == ["silent0", "acking"]',
    ),
    SourceMutation(
        "the gate lets its document's later messages through, ahead of documents held behind it",
        *CHILD["gate-lets-its-document-through"],
        "tests/dispatcher/test_key_order.py::"
        "test_the_gates_own_later_message_waits_behind_documents_held_before_it",
        _plain(
            test_key_order.test_the_gates_own_later_message_waits_behind_documents_held_before_it
        ),
        'assert sent(t) == ["A-1"]',
    ),
    SourceMutation(
        "a dispatch reads none of the paused keys other processes recorded",
        "dispatcher.keys:KeyOrder.refresh",
        (("fresh = self.lines.paused_among(keys)", "fresh = {}"),),
        "tests/dispatcher/test_key_order.py::"
        "test_a_pause_holds_every_dispatcher_that_shares_the_lines",
        _sharing_lines(test_key_order.test_a_pause_holds_every_dispatcher_that_shares_the_lines),
        'assert report.failed == ["B"]',
    ),
    SourceMutation(
        "the paused keys' probe in the queue database claims no key is paused",
        "dispatcher.queue.key_lines:SqlKeyLines.paused_among",
        (("if c.exec_driver_sql(_ANY_HOLD).first() is None:", "if True:"),),
        "tests/dispatcher/test_key_order.py::"
        "test_a_pause_holds_every_dispatcher_that_shares_the_lines",
        _sharing_sqlite_lines(
            test_key_order.test_a_pause_holds_every_dispatcher_that_shares_the_lines
        ),
        'assert report.failed == ["B"]',
    ),
    SourceMutation(
        "a send waits for no earlier send in flight that shares one of its keys",
        "dispatcher.keys:KeyOrder._first",
        (("if not keys.isdisjoint(theirs):", "if False:"),),
        "tests/dispatcher/test_dispatch_fast_path.py::"
        "test_a_dispatch_on_a_key_another_document_holds_waits_while_its_send_is_in_the_broker",
        _plain(
            test_dispatch_fast_path.test_a_dispatch_on_a_key_another_document_holds_waits_while_its_send_is_in_the_broker
        ),
        "assert sent(t) == []  # B-1 did not overtake X-1",
    ),
    SourceMutation(
        "the documents are not sorted when a session is named after another document",
        "dispatcher.dispatch:shared",  # the name the dispatch calls it by
        (
            (
                "m.ordering_key != row.id",
                "m.ordering_key not in {r.id for r, _ in plans}",  # no document's own key
            ),
        ),
        "tests/dispatcher/test_dispatch_fast_path.py::"
        "test_a_session_named_after_another_document_keeps_the_written_order",
        _plain(
            test_dispatch_fast_path.test_a_session_named_after_another_document_keeps_the_written_order
        ),
        'assert sent(t) == ["B-1", "A-1"], coalesce',
    ),
    SourceMutation(
        "a shared send that fell back to a document at a time is recorded as taken whole",
        "dispatcher.dispatch:Dispatcher._run_chunk",
        (
            (
                "return [self._send_document(row, msgs, started, outage) for row, msgs in chunk]",
                "return None if [self._send_document(row, msgs, started, outage) "
                "for row, msgs in chunk] else None",
            ),
        ),
        "tests/dispatcher/test_dispatch_fast_path.py::"
        "test_a_refused_message_in_a_shared_send_marks_only_what_the_transport_took",
        _plain(
            test_dispatch_fast_path.test_a_refused_message_in_a_shared_send_marks_only_what_the_transport_took
        ),
        'assert marks.marks == {"A": 1, "C": 1}',
    ),
    SourceMutation(
        "a document sent whole in a later round of a dispatch starts where that round did",
        "dispatcher.outcomes:DispatchReport._settle_whole",
        (
            (
                "start = row.dispatched_seq if first is None else first.start_seq",
                "start = row.dispatched_seq",
            ),
        ),
        "tests/dispatcher/test_dispatch_fast_path.py::"
        "test_a_document_held_back_then_sent_whole_keeps_where_it_started",
        _plain(
            test_dispatch_fast_path.test_a_document_held_back_then_sent_whole_keeps_where_it_started
        ),
        'assert report.outcomes["B"] == DocumentOutcome("B", 0, 2, 2)',
    ),
    SourceMutation(
        "a Kafka send returns once its records are produced, before their delivery reports",
        "dispatcher.kafka.transport:KafkaTransport.send",
        (("self._wait(pending, batch)", "pass"),),
        "tests/dispatcher/test_kafka_delivery_reports.py::"
        "test_a_send_returns_after_every_report_of_its_batch_whoever_polled_it",
        _plain(
            test_kafka_delivery_reports.test_a_send_returns_after_every_report_of_its_batch_whoever_polled_it
        ),
        'assert missing == {"one": set(), "two": set()}',
    ),
    SourceMutation(
        "holds kept only in the view while the store failed are not written to it",
        "dispatcher.keys:KeyOrder._flush_local",
        (("if not local:", "if True:"),),
        "tests/dispatcher/test_key_order.py::"
        "test_a_hold_made_while_the_store_failed_outlives_its_return",
        _plain(test_key_order.test_a_hold_made_while_the_store_failed_outlives_its_return),
        "assert sent(t) == []",
    ),
    SourceMutation(
        "an operator's resume that could not be written is reported as done",
        "dispatcher.keys:KeyOrder._remove",
        (("if strict:", "if False:"),),
        "tests/dispatcher/test_key_order.py::test_a_resume_by_hand_that_cannot_be_written_fails",
        _plain(test_key_order.test_a_resume_by_hand_that_cannot_be_written_fails),
        'with pytest.raises(OSError, match="database is locked"):',
    ),
    SourceMutation(
        "resume gives up on whatever gate the key has now, not the one it names",
        "dispatcher.keys:KeyOrder.resume",
        (("if not line or line[0].message_id != message_id:", "if not line:"),),
        "tests/dispatcher/test_key_order.py::test_resume_is_idempotent_for_one_pause",
        _plain(test_key_order.test_resume_is_idempotent_for_one_pause),
        'assert d.resume("q", "k", "A-1") is False',
    ),
    SourceMutation(
        "a dispatch sends again to a destination that did not answer, once per document",
        "dispatcher.dispatch:Dispatcher._send",
        (("outage.check(batch)", "pass"),),
        "tests/dispatcher/test_key_order.py::"
        "test_a_dispatch_during_an_outage_makes_one_send_whatever_its_size",
        _plain(test_key_order.test_a_dispatch_during_an_outage_makes_one_send_whatever_its_size),
        "assert t.calls == 1, coalesce",
    ),
    SourceMutation(
        "a transport that declares nothing is taken to coalesce documents into one send",
        "dispatcher.transports.base:Capabilities.of",
        (
            (
                "and bool(transport.coalesce_sends),",
                "or True,",
            ),
        ),
        "tests/dispatcher/test_transport_capabilities.py::"
        "test_a_transport_that_declares_nothing_gets_the_defaults",
        _plain(
            test_transport_capabilities.test_a_transport_that_declares_nothing_gets_the_defaults
        ),
        "assert Capabilities.of(bare) == Capabilities() == Capabilities(False, False)",
    ),
    SourceMutation(
        "a transport's declared atomic batches are not read",
        "dispatcher.transports.base:Capabilities.of",
        (("and bool(transport.atomic_batches),", "and False,"),),
        "tests/dispatcher/test_transport_capabilities.py::test_a_declared_capability_is_honoured",
        _plain(test_transport_capabilities.test_a_declared_capability_is_honoured),
        "assert Capabilities.of(Atomic()) == Capabilities(atomic_batches=True)",
    ),
    SourceMutation(
        "the runtime does not hand its settings to a transport that adopts them",
        "dispatcher.runtime:DispatcherRuntime.__init__",
        (("adopt_settings(self.transport, settings)", "pass"),),
        "tests/dispatcher/test_transport_capabilities.py::"
        "test_the_runtime_hands_its_settings_to_a_transport_that_adopts_them",
        _in_workspace(
            test_transport_capabilities.test_the_runtime_hands_its_settings_to_a_transport_that_adopts_them
        ),
        "assert adopting.adopted == [ob.settings]",
    ),
    SourceMutation(
        "an empty where filter counts as a selection (Service Bus took it for every dead letter)",
        "dispatcher.queue.selection:DeadLetterSelection.of",
        (
            (
                "if sum([ids is not None, bool(where), all]) != 1:",
                "if sum([ids is not None, where is not None, all]) != 1:",
            ),
        ),
        "tests/queue/test_selection.py::test_exactly_one_of_ids_a_filter_or_all",
        _plain(test_selection.test_exactly_one_of_ids_a_filter_or_all),
        'with pytest.raises(ValidationError, match="exactly one"):',
    ),
    SourceMutation(
        "the SQLite queue tables are recreated without AUTOINCREMENT (a deleted newest id returns)",
        "migrations.sql.ids:never_reuse",
        (('{"sqlite_autoincrement": True}', '{"sqlite_autoincrement": False}'),),
        "tests/queue/test_unique_ids.py::"
        "test_a_completed_newest_messages_sequence_number_is_not_reused",
        _with_queue(
            test_unique_ids.test_a_completed_newest_messages_sequence_number_is_not_reused,
            by_revisions=True,
        ),
        "assert new.sequence_number > 3",
    ),
    SourceMutation(
        "a new database's tables are created without looking for the version table under the "
        "lock (two processes opening it both create them)",
        "migrations.sql:_create_at_head",
        (("if inspect(conn).has_table(VERSION_TABLE):", "if False:"),),
        "tests/queue/test_fresh_schema.py::"
        "test_two_processes_opening_one_new_database_create_it_once",
        _on_sqlite(test_fresh_schema.test_two_processes_opening_one_new_database_create_it_once),
        "assert sorted(map(str, results))",
    ),
    SourceMutation(
        "the upgrade numbers on from the highest id left, not above every id handed out",
        "migrations.sql.ids:unused_before_now",
        (("return time.time_ns() // 1000", "return 0"),),
        "tests/queue/test_unique_ids.py::"
        "test_the_upgrade_keeps_every_row_and_id_and_reuses_none_deleted_before_it",
        _on_sqlite(
            test_unique_ids.test_the_upgrade_keeps_every_row_and_id_and_reuses_none_deleted_before_it
        ),
        "assert new.sequence_number > 6",
    ),
    SourceMutation(
        "an inbox prune deletes live claims too",
        "dispatcher.queue.inbox:SqlInbox.prune",
        (
            (
                "or_(c.lease_until.is_(None), c.lease_until < before)",
                "or_(c.lease_until.is_(None), c.lease_until.is_not(None))",
            ),
        ),
        "tests/queue/test_inbox_pruning.py::TestSqlInboxPruning::"
        "test_a_live_claim_is_never_pruned_however_long_ago_it_was_taken",
        _pruning("test_a_live_claim_is_never_pruned_however_long_ago_it_was_taken"),
        "assert inbox.prune(now - DAY) == 0",
    ),
    SourceMutation(
        "a running consumer prunes its inbox on every run, not at most once an interval",
        "dispatcher.queue.inbox_pruning:InboxPruner.maybe_prune",
        (("if self._last is not None and now - self._last < self.every:", "if False:"),),
        "tests/queue/test_inbox_pruning.py::"
        "test_a_running_consumer_prunes_its_inbox_at_most_once_an_hour",
        _with_queue(
            test_inbox_pruning.test_a_running_consumer_prunes_its_inbox_at_most_once_an_hour,
            clock=True,
        ),
        'assert billing.handled("ancient")  # not due: it pruned less than an hour ago',
    ),
    SourceMutation(
        "outbox maintain works on the table without the one-maintainer guard",
        "outbox.app.maintenance:maintain",
        (("one_maintainer(store, sql_url, clock) if _writes(opts) else ", ""),),
        "tests/write_path/test_one_maintainer.py::"
        "test_a_second_maintain_while_the_first_folds_skips_in_one_plain_line",
        _with_monkeypatch(
            test_one_maintainer.test_a_second_maintain_while_the_first_folds_skips_in_one_plain_line
        ),
        'assert not [m for m in said if "meanwhile" in m or "Snapshot Isolation" in m]',
    ),
    SourceMutation(
        "a delete appends without its per-document application transaction",
        "outbox.delta.store:DeltaDocumentStore._append_documents",
        (
            (
                "documents=[(w.row.id, w.row.version) for w in writes],",
                "documents=[(w.row.id, w.row.version) for w in writes if not w.row.deleted],",
            ),
        ),
        "tests/write_path/test_delete.py::test_a_delete_and_a_save_appending_at_once_one_wins",
        _in_workspace(test_delete.test_a_delete_and_a_save_appending_at_once_one_wins),
        'assert sorted(type(e).__name__ for e in errors) == ["ConcurrencyError", "NoneType"]',
    ),
    SourceMutation(
        "the fold removes a tombstone whose messages are not sent",
        "outbox.delta.fold:_sent_tombstones",
        (
            (
                'sent = top.filter(pc.greater_equal(top["dispatched_seq_max"], top["last_seq"]))',
                "sent = top",
            ),
        ),
        "tests/write_path/test_delete.py::"
        "test_the_fold_keeps_a_tombstone_until_its_messages_are_sent",
        _with_outbox(test_delete.test_the_fold_keeps_a_tombstone_until_its_messages_are_sent),
        'assert [(r["version"], r["deleted"]) for r in _raw(ob, "dev-1")] == [(2, True)]',
    ),
    SourceMutation(
        "a create over a tombstone whose messages are not sent is let through",
        "outbox.delta.group_commit:recheck",
        (('if int(found["last_seq"]) > int(found["dispatched_seq"]):', "if False:"),),
        "tests/write_path/test_delete.py::test_a_create_over_an_unsent_tombstone_is_refused",
        _with_outbox(test_delete.test_a_create_over_an_unsent_tombstone_is_refused),
        "with pytest.raises(ConcurrencyError, match=unsent), ob.unit_of_work() as uow:",
    ),
    SourceMutation(
        "a create right after a delete does not write this process's marks before it gives up",
        "outbox.unit_of_work:UnitOfWork._save_after_marks",
        (("if any(r.deleted and r.has_pending for r in rows.values()):", "if True:"),),
        "tests/write_path/test_delete.py::"
        "test_a_create_right_after_a_delete_in_this_process_needs_no_wait",
        lambda tmp: test_delete.test_a_create_right_after_a_delete_in_this_process_needs_no_wait(
            tmp / "ws", ManualClock()
        ),
        "assert create(ob, read_first) is None",
    ),
    SourceMutation(
        "the consumer hands a message to the completer before its handler returns",
        "dispatcher.queue.consumer:Consumer._run_bare",
        (
            ("self.completer.add(msg)", "pass"),
            ("failed = self._call(msg)", "self.completer.add(msg); failed = self._call(msg)"),
        ),
        "tests/queue/test_batch_completion.py::"
        "test_a_handler_held_on_an_event_leaves_its_message_locked_and_uncompleted",
        _with_queue(
            test_batch_completion.test_a_handler_held_on_an_event_leaves_its_message_locked_and_uncompleted,
            clock=True,
        ),
        'assert [p.state for p in queue.peek("q")] == ["locked"]',
    ),
    SourceMutation(
        "the consumer's receives never grow (a fixed 16 however deep the queue)",
        "dispatcher.queue.receive_size:ReceiveSize.handled",
        (("self.size = min(self.top, self.size * 2)", "pass"),),
        "tests/queue/test_receive_size.py::"
        "test_receives_double_while_the_queue_is_deep_and_the_handlers_quick",
        _with_queue(
            test_receive_size.test_receives_double_while_the_queue_is_deep_and_the_handlers_quick
        ),
        "assert asked[:7] == [16, 32, 64, GROWN, GROWN, GROWN, GROWN]",
    ),
    SourceMutation(
        "the consumer's receives grow whatever its handlers take",
        "dispatcher.queue.receive_size:ReceiveSize.handled",
        (("if seconds > QUICK:", "if False:"),),
        "tests/queue/test_receive_size.py::test_a_slow_batch_keeps_receives_at_the_base",
        _with_queue(test_receive_size.test_a_slow_batch_keeps_receives_at_the_base, clock=True),
        "assert set(asked) == {16}",
    ),
    SourceMutation(
        "a short receive does not bring the consumer's receives back to the base",
        "dispatcher.queue.receive_size:ReceiveSize.received",
        (("self.size = self.base", "pass"),),
        "tests/queue/test_receive_size.py::test_a_short_receive_starts_again_from_the_base",
        _with_queue(test_receive_size.test_a_short_receive_starts_again_from_the_base),
        "assert asked[:6] == [16, 32, 64, 16, 32, 64]",
    ),
    SourceMutation(
        "the completer has no backlog cap (handled messages pile up uncompleted)",
        "dispatcher.queue.completer:Completer._full",
        (("return self._count >= self.batch", "return False"),),
        "tests/queue/test_batch_completion.py::"
        "test_a_dead_process_repeats_only_its_unflushed_messages_never_more_than_a_batch",
        _with_queue(
            test_batch_completion.test_a_dead_process_repeats_only_its_unflushed_messages_never_more_than_a_batch,
            clock=True,
        ),
        "assert len(again) <= 5",
    ),
    SourceMutation(
        "a handled message leaves the renewed set before its completion's flush",
        "dispatcher.queue.consumer:Consumer._process",
        (("if not handed:", "if True:"),),
        "tests/queue/test_batch_completion.py::"
        "test_a_message_awaiting_its_completion_is_renewed_past_half_its_lock",
        _with_queue(
            test_batch_completion.test_a_message_awaiting_its_completion_is_renewed_past_half_its_lock,
            clock=True,
        ),
        'assert "a" in renewed',
    ),
    SourceMutation(
        "stop leaves the batch received ahead locked until its locks run out",
        "dispatcher.queue.consumer:Consumer._let_go",
        (("self._settle(self.queue.abandon, msg)", "pass"),),
        "tests/queue/test_batch_completion.py::"
        "test_stop_abandons_the_batch_received_ahead_and_completes_the_handled",
        _with_queue(
            test_batch_completion.test_stop_abandons_the_batch_received_ahead_and_completes_the_handled,
            clock=True,
        ),
        'assert left == [("m3", "active"), ("m4", "active")]',
    ),
]


def _failing_source_line(error: BaseException, owner: Callable[..., Any]) -> str:
    """The owner's source line the failure was raised from (its innermost frame there)."""
    code = getattr(owner, "__code__", None)
    return failing_line(error, code.co_filename if code is not None else "")


def _owner_function(m: SourceMutation) -> Callable[..., Any]:
    path, _, rest = m.owner.partition("::")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    obj: Any = module
    for part in rest.split("::"):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name for m in MUTATIONS])
@pytest.mark.slow  # seconds each: left out of the fast lane
def test_the_owning_test_catches_the_source_mutation(
    m: SourceMutation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = _owner_function(m)  # its intact run: the test below, once for every row
    cls, attr, broken = mutated(m.target, m.edits)
    monkeypatch.setattr(cls, attr, broken)
    with pytest.raises((AssertionError, pytest.fail.Exception)) as caught:
        m.run_owner(tmp_path / "mutated")
    monkeypatch.undo()
    assert m.failing_line in _failing_source_line(caught.value, owner), (
        f"{m.owner} failed elsewhere than on {m.failing_line!r}: {caught.value!r}"
    )


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_the_recompiled_function_is_the_original_when_nothing_is_edited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mechanism itself: recompiled without an edit, every owner still passes (the intact
    run of every row's owner, once for all rows)."""
    for m in MUTATIONS:
        cls, attr, same = mutated(m.target, ())
        with monkeypatch.context() as patch:
            patch.setattr(cls, attr, same)
            m.run_owner(tmp_path / m.name.replace(" ", "-"))
