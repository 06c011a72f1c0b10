"""The settings reference in docs/configuration.md is generated from the declarations
(``outbox.core.settings_reference``): the committed block must be what the code renders now, so a
setting added, renamed, re-defaulted or re-documented without regenerating the page fails here."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from outbox.core import settings_reference as ref
from outbox.core.settings import Settings
from outbox.core.settings_backends import SHIPPED, KafkaOptions
from outbox.core.settings_values import DOC

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / ref.DOCUMENT


def test_the_committed_reference_is_what_the_code_renders() -> None:
    text = PAGE.read_text()
    assert "<!-- settings:reference -->" in text
    assert ref.render(text) == text, "run: python -m outbox.core.settings_reference"


def test_every_setting_and_every_key_has_a_row_and_a_sentence() -> None:
    block = ref.render_block()
    for f in dataclasses.fields(Settings):
        assert f.metadata.get(DOC), f.name
        assert f"| `{f.name}` |" in block
    for options in SHIPPED:
        assert f"### `[{options.SECTION}]`" in block
        for key, f in options.option_fields().items():
            assert f.metadata.get(DOC), key
            assert f"| `{key}` | `{options.variable(key)}` |" in block


def test_a_changed_default_makes_the_committed_block_stale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The drift check can fail: a default changed in the code (30s -> 45s) and not in the
    page is found, by the test above's comparison and by ``--check``."""
    changed = copy.copy(KafkaOptions.__dataclass_fields__["send_timeout"])
    changed.default = 45.0
    monkeypatch.setitem(KafkaOptions.__dataclass_fields__, "send_timeout", changed)
    text = PAGE.read_text()
    assert "| `send_timeout` | `OUTBOX_KAFKA_SEND_TIMEOUT` | `45s` |" in ref.render(text)
    assert ref.render(text) != text
    page = tmp_path / "configuration.md"
    page.write_text(text)
    assert ref.main(["--check", "--file", str(page)]) == 1
    assert ref.main(["--file", str(page)]) == 0  # rewrites it
    assert ref.main(["--check", "--file", str(page)]) == 0
