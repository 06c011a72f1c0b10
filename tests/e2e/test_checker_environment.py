"""The checker's children see the supervisor's environment as it is when they start, not as it
was when the fork server started (once per process): an object store's endpoint set after an
earlier check (``AZURITE_BLOB_STORAGE_URL``, ``AWS_*``) must reach them. Seen in CI: every
Azurite seed failed with "the store did not answer" after a local seed had run first."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from outbox.app.checker import procs
from outbox.app.checker.reap import context


def record_environment(cfg: dict[str, Any]) -> None:
    Path(cfg["out"]).write_text(json.dumps({"mark": os.environ.get("OUTBOX_TEST_MARK")}))


def _run(ctx: Any, out: Path) -> dict[str, Any]:
    proc = ctx.Process(
        target=procs.with_environment,
        args=(record_environment, {"out": str(out)}, dict(os.environ)),
    )
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_a_variable_set_after_the_fork_server_started_reaches_the_child(
    tmp_path: Path, monkeypatch: Any
) -> None:
    ctx = context()
    monkeypatch.delenv("OUTBOX_TEST_MARK", raising=False)
    _run(ctx, tmp_path / "first.json")  # the fork server is running from here on
    monkeypatch.setenv("OUTBOX_TEST_MARK", "set later")
    assert _run(ctx, tmp_path / "second.json") == {"mark": "set later"}
