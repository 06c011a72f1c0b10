"""Starting telemetry: a missing SDK and a misplaced option each give one line with the fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.app.cli import main
from outbox.core import telemetry
from outbox.core.errors import ConfigurationError


def test_without_the_sdk_the_error_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.metrics", None)  # import fails
    with pytest.raises(ConfigurationError, match=r"pip install 'delta-outbox\[otel\]'"):
        telemetry.configure(metrics_port=1)


def test_nothing_is_installed_when_nothing_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.metrics", None)
    telemetry.configure(metrics_port=None)  # no SDK needed, no error


def test_rescue_metrics_port_needs_every(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["-w", str(tmp_path), "rescue", "--metrics-port", "9464"])
    assert result.exit_code != 0
    assert "--metrics-port serves a long-running rescuer" in result.output
    assert "Traceback" not in result.output


def test_otlp_endpoint_installs_otlp_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")  # no export during the test
    try:
        telemetry.configure(metrics_port=None)
        tracer_provider, meter_provider = telemetry._tracer_provider, telemetry._meter_provider
        assert isinstance(tracer_provider, TracerProvider)
        assert isinstance(meter_provider, MeterProvider)
        processors = tracer_provider._active_span_processor._span_processors
        assert [type(p.span_exporter).__name__ for p in processors] == ["OTLPSpanExporter"]  # type: ignore[attr-defined]
        readers = meter_provider._metric_readers
        assert [type(r._exporter).__name__ for r in readers] == ["OTLPMetricExporter"]  # type: ignore[attr-defined]
    finally:
        telemetry.use(None, None)


def test_a_port_in_use_is_one_line_naming_the_option() -> None:
    import socket

    from outbox.core.health import Health, serve

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match=rf"--metrics-port {port}: cannot listen"):
            serve(port, Health())
