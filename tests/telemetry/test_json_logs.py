"""``--log-format json``: one JSON object per stderr line, with the trace id inside a span."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from outbox.app.facade import Outbox
from outbox.core.telemetry import JsonLogFormatter
from tests.telemetry.conftest import Otel

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def test_a_log_line_inside_a_span_carries_its_trace_id(otel: Otel) -> None:
    record = logging.LogRecord("outbox.worker", logging.INFO, __file__, 1, "sent %d", (3,), None)
    with otel.tracer_provider.get_tracer("t").start_as_current_span("work") as span:
        line = json.loads(JsonLogFormatter().format(record))
    assert line["message"] == "sent 3"
    assert line["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert "trace_id" not in json.loads(JsonLogFormatter().format(record))  # no span, no id


def test_run_dispatcher_logs_json_lines(tmp_path: Path) -> None:
    ws = str(tmp_path / "ws")
    Outbox.open(ws).close()  # the workspace, made in this process: one child is enough
    result = subprocess.run(
        [OUTBOX, "--log-format", "json", "-w", ws, "run-dispatcher", "--once"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(ln) for ln in result.stderr.splitlines()]
    assert any(ln["logger"] == "outbox.worker" and ln["level"] == "INFO" for ln in lines), lines
