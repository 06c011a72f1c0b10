"""``--metrics-port``: real ``run-dispatcher`` and ``rescue --every`` processes serve Prometheus
text, and the numbers are what the test made them do; their ``/healthz`` and ``/readyz`` answer,
and readiness follows the queue database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from migrations.sql import upgrade
from outbox.app.facade import Outbox
from outbox.testing.crash_points import InjectedCrash, crash_points
from tests.telemetry.proxy import Proxy
from tests.telemetry.scrape import free_port, probe, scrape, value, wait_for

OUTBOX = str(Path(sys.executable).with_name("outbox"))
DOCS, MSGS = 3, 2


def write(ob: Outbox, doc_id: str) -> None:
    with ob.unit_of_work() as uow:
        doc = uow.create(doc_id, type="order")
        for n in range(MSGS):
            doc.send("OrderPlaced", {"n": n})


@pytest.mark.postgres
@pytest.mark.slow  # seconds each: left out of the fast lane
def test_run_dispatcher_serves_prometheus_metrics_and_health(pg_url: str, tmp_path: Path) -> None:
    """Its queue is PostgreSQL behind a proxy: after the metrics, the test cuts the proxy, and
    ``/readyz`` must say not ready, with the queue's reason, while ``/healthz`` stays alive (the
    worker retries the outage); then ready again once the proxy is back."""
    upgrade(pg_url)
    url = make_url(pg_url)
    proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    ws = tmp_path / "ws"
    with Outbox.open(ws, sql_url=proxied, default_destination="shipments") as ob:
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
    cmd = [OUTBOX, "-w", str(ws), "run-dispatcher", "--poll-interval", "50ms"]
    worker = subprocess.Popen(
        [*cmd, "--metrics-port", str(port)],
        env={**os.environ, "OUTBOX_SQL_URL": proxied},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Both in one scrape: the pending gauge's table scan may start before the last
        # command's watermark MERGE while the counters are read after it (CI saw 8 pending
        # with 3 commands completed); a watermark never written still fails by timeout.
        samples = wait_for(
            worker,
            f"{DOCS} commands completed and only the stuck document pending",
            lambda: scrape(port),
            lambda s: (
                value(s, "outbox_commands_completed_total") >= DOCS
                and value(s, "outbox_pending_messages") == MSGS
            ),
        )
        assert value(samples, "outbox_messages_sent_total") == DOCS * MSGS
        # one sample per send that settled (not per message: docs/observability.md)
        settled_sends = value(samples, "outbox_send_calls_total") - value(
            samples, "outbox_send_failures_total"
        )
        assert value(samples, "outbox_dispatch_settle_duration_seconds_count") == settled_sends
        assert value(samples, "outbox_watermark_merges_total") >= 1
        assert value(samples, "outbox_queue_messages", queue="shipments", state="active") == 6
        assert value(samples, "outbox_queue_messages", queue=commands, state="active") == 0
        assert value(samples, "outbox_pending_messages") == MSGS  # the stuck document's
        assert value(samples, "outbox_pending_oldest_age_seconds") > 0
        alive = (200, {"alive": True, "reason": "ticking"})
        ready = (200, {"ready": True, "reason": "store and queue reachable"})
        assert probe(port, "/healthz") == alive
        assert probe(port, "/readyz") == ready

        proxy.cut()  # the queue database is gone
        status, body = wait_for(
            worker, "not ready", lambda: probe(port, "/readyz"), lambda r: r[0] != 200
        )
        assert (status, body["ready"]) == (503, False)
        reason = body["reason"]
        assert reason.startswith("queue: cannot read queue stats: the queue database "), reason
        # the pooled connection in use a moment ago fails first (pings only after 0.1 s idle:
        # outbox.core.sql.ping_when_idle), a new one is refused
        assert (
            f"port {proxy.port} failed: Connection refused" in reason
            or "server closed the connection unexpectedly" in reason
        ), reason
        assert probe(port, "/healthz") == alive  # retrying the outage, not stuck
        proxy.restore()
        wait_for(worker, "ready again", lambda: probe(port, "/readyz"), lambda r: r == ready)
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err[-3000:]
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
        samples = wait_for(
            rescuer,
            "a rescue pass",
            lambda: scrape(port),
            lambda s: value(s, "outbox_rescue_passes_total") >= 1,
        )
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
