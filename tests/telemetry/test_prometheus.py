"""``--metrics-port``: real ``run-dispatcher`` and ``rescue --every`` processes serve Prometheus
text, and the numbers are what the test made them do."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outbox.app import Outbox
from outbox.testing.crash_points import InjectedCrash, crash_points
from tests.telemetry.scrape import free_port, probe, scrape, value

OUTBOX = str(Path(sys.executable).with_name("outbox"))
DOCS, MSGS = 3, 2


def write(ob: Outbox, doc_id: str) -> None:
    with ob.unit_of_work() as uow:
        doc = uow.create(doc_id, type="order")
        for n in range(MSGS):
            doc.send("OrderPlaced", {"n": n})


def test_run_dispatcher_serves_prometheus_metrics(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    with Outbox.open(ws, default_destination="shipments") as ob:
        for i in range(DOCS):  # the dispatcher dies after each commit: commands finish the job
            crash_points.arm("after_commit")
            with pytest.raises(InjectedCrash):
                write(ob, f"order-{i}")
        pending = ob.store.scan_pending().to_pylist()
        crash_points.arm("after_commit")
        with pytest.raises(InjectedCrash):
            write(ob, "stuck")  # pending, and no command names it: the rescuer's job
        crash_points.disarm()
        assert ob.runtime.enqueue_commands((str(r["id"]), int(r["last_seq"])) for r in pending) == 3
        commands = ob.settings.command_queue
    port = free_port()
    port_option = ["--metrics-port", str(port)]
    worker = subprocess.Popen(
        [OUTBOX, "-w", str(ws), "run-dispatcher", "--poll-interval", "50ms", *port_option],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        while value(samples, "outbox_commands_completed_total") < DOCS:
            assert worker.poll() is None, worker.communicate()[1]
            assert time.monotonic() < deadline, f"never completed {DOCS} commands: {samples}"
            try:
                samples = scrape(port)
            except OSError:  # not listening yet
                time.sleep(0.05)  # poll again; the loop's condition has its deadline
        assert value(samples, "outbox_messages_sent_total") == DOCS * MSGS
        assert value(samples, "outbox_dispatch_settle_duration_seconds_count") == DOCS * MSGS
        assert value(samples, "outbox_watermark_merges_total") >= 1
        assert value(samples, "outbox_queue_messages", queue="shipments", state="active") == 6
        assert value(samples, "outbox_queue_messages", queue=commands, state="active") == 0
        assert value(samples, "outbox_pending_messages") == MSGS  # the stuck document's
        assert value(samples, "outbox_pending_oldest_age_seconds") > 0
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "Traceback" not in err


def test_rescue_every_serves_prometheus_metrics(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    with Outbox.open(ws, default_destination="shipments") as ob:
        write(ob, "sent")  # dispatched at once: nothing for the rescuer
    port = free_port()
    rescuer = subprocess.Popen(
        [OUTBOX, "-w", str(ws), "rescue", "--every", "1s", "--metrics-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        while value(samples, "outbox_rescue_passes_total") < 1:
            assert rescuer.poll() is None, rescuer.communicate()[1]
            assert time.monotonic() < deadline, f"no rescue pass reported: {samples}"
            try:
                samples = scrape(port)
            except OSError:  # not listening yet
                time.sleep(0.05)  # poll again; the loop's condition has its deadline
        assert ("outbox_rescue_lag_versions", frozenset()) in samples
        assert value(samples, "outbox_rescue_commands_enqueued_total") == 0
        assert value(samples, "outbox_rescue_pending_documents") == 0
        # the table and the queue, as run-dispatcher reports them
        assert ("outbox_pending_messages", frozenset()) in samples
        assert value(samples, "outbox_pending_messages") == 0
        assert value(samples, "outbox_queue_messages", queue="shipments", state="active") == MSGS
        assert probe(port, "/healthz") == (200, {"alive": True, "reason": "ticking"})
        assert probe(port, "/readyz") == (
            200,
            {"ready": True, "reason": "store and queue reachable"},
        )
    finally:
        rescuer.send_signal(signal.SIGTERM)
        _out, err = rescuer.communicate(timeout=30)
    assert rescuer.returncode == 0, err
    assert "Traceback" not in err
