"""The new retention settings, wrong, through the CLI: one clear line each, no traceback, nothing
lost (tests/test_bad_input.py's way; the cases live here to keep that table unchanged)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox import Outbox
from outbox.app.cli import main
from tests.workspaces import dispatched_workspace

CASES = [
    (
        "negative dead-letter retention",
        {"OUTBOX_DEAD_LETTER_RETENTION": "-1d"},
        "error: setting 'dead_letter_retention' has an invalid value '-1d'",
    ),
    (
        "dead-letter retention not a duration",
        {"OUTBOX_DEAD_LETTER_RETENTION": "a month"},
        "error: setting 'dead_letter_retention' has an invalid value 'a month'",
    ),
    (
        "negative replay retention",
        {"OUTBOX_REPLAY_RETENTION": "-5m"},
        "error: setting 'replay_retention' has an invalid value '-5m'",
    ),
    (
        "claim retention shorter than duplicate detection",
        {"OUTBOX_CLAIM_RETENTION": "5m"},
        "error: setting 'claim_retention' is invalid: 300s is shorter than "
        "duplicate_detection_window (600s): a finished claim drops the copies that detection "
        "lets through, so it must stay at least as long; e.g. 7d (or 0: keep)",
    ),
]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dispatched_workspace(tmp_path_factory.mktemp("bad") / "ws")


@pytest.mark.parametrize(("env", "expected"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
@pytest.mark.parametrize("command", ["maintain", "status"])
def test_a_bad_retention_setting_is_one_clear_line(
    ws: Path, command: str, env: dict[str, str], expected: str
) -> None:
    result = CliRunner().invoke(main, ["-w", str(ws), command], env=env)
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.stderr.splitlines() if not ln[:4].isdigit()]  # no log lines
    assert lines == [expected]
    assert "Traceback" not in result.output
    with Outbox.open(ws, transport="memory", create=False) as ob:  # nothing lost
        _, rows = ob.store.read(["pkg-1"])
        assert rows["pkg-1"].last_seq == rows["pkg-1"].dispatched_seq == 1


def test_zero_keeps_for_ever_and_is_accepted(ws: Path) -> None:
    env = {"OUTBOX_DEAD_LETTER_RETENTION": "0", "OUTBOX_CLAIM_RETENTION": "0"}
    result = CliRunner().invoke(main, ["-w", str(ws), "maintain", "--json"], env=env)
    assert result.exit_code == 0, result.output


def test_a_negative_retention_from_python_is_one_clear_error() -> None:
    """The duration reader refuses a negative text; a number from Python meets the check."""
    from outbox.core.errors import ConfigurationError
    from outbox.core.settings import Settings

    with pytest.raises(ConfigurationError) as caught:
        Settings(dead_letter_retention=-5)
    assert str(caught.value) == (
        "setting 'dead_letter_retention' is invalid: -5s; must be 0 (keep) or positive, e.g. 30d"
    )
