"""Retention in one place (issue 44, item 4): every item of ``outbox.app.retention`` gets an old
row and a young one, ``outbox maintain`` (the CLI) deletes the old and keeps the young, on SQLite
and PostgreSQL; ``outbox status`` shows what each holds (terminal, plain, ``--json``); the docs
table is the registry's; and each pruner, disabled, fails its check."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from outbox import Outbox
from outbox.app.cli import output
from outbox.app.retention import ITEMS, Item, docs_table
from tests.mutate import mutated
from tests.retention.seeds import CHECKS, DAY, DISABLED, Seeded, cli, seed, workspace

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


@pytest.fixture
def seeded(tmp_path: Path, sql_url: str) -> Seeded:
    s = workspace(tmp_path / "ws", sql_url)
    seed(s)
    return s


@pytest.fixture(scope="module")
def seeded_once(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    """A seeded workspace on SQLite for the disabled pruners, each of which maintains a copy
    (``_copy``): seeding one (the table's history, a maintain, three replays, every item's
    rows) was most of each of those tests."""
    root = tmp_path_factory.mktemp("seeded")
    s = workspace(root / "ws", f"sqlite:///{root / 'outbox.db'}")
    seed(s)
    return s


def _copy(template: Seeded, where: Path) -> Seeded:
    """The seeded workspace and its database copied to ``where``: the table's folder with its
    files' times (the log's old commits are old by their times), the database by SQLite's
    backup API. The table keeps its id, which is what its replays are recorded under."""
    shutil.copytree(template.ws, where / "ws")  # copy2: contents and times
    url = f"sqlite:///{where / 'outbox.db'}"
    src, dst = (
        sqlite3.connect(template.url.removeprefix("sqlite:///")),
        sqlite3.connect(str(where / "outbox.db")),
    )
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    return dataclasses.replace(
        template,
        ws=where / "ws",
        url=url,
        env={**template.env, "OUTBOX_SQL_URL": url},
        old_commits=list(template.old_commits),
        replays=dict(template.replays),
    )


def _maintain(seeded: Seeded) -> dict[str, Any]:
    result = cli(seeded, "maintain", "--json")
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_outbox_maintain_prunes_every_item_and_keeps_the_young_rows(seeded: Seeded) -> None:
    report = _maintain(seeded)
    assert [i["setting"] for i in report["retention"]] == [i.setting for i in ITEMS]
    for check in CHECKS.values():
        check(seeded, report)
    again = _maintain(seeded)  # nothing old is left: the young rows stay
    for i in again["retention"]:
        if i["setting"] not in ("compact_every", "log_retention"):
            assert i["deleted"] in (0, None), i
    CHECKS["dead_letter_retention"](seeded, report)


def test_the_audit_trail_is_kept_for_ever_by_default(seeded: Seeded) -> None:
    seeded.env.pop("OUTBOX_AUDIT_RETENTION")
    report = _maintain(seeded)
    (audited,) = [i for i in report["retention"] if i["setting"] == "audit_retention"]
    assert audited["setting_s"] == 0
    assert audited["deleted"] is None
    status = json.loads(cli(seeded, "status", "--json").stdout)
    (kept,) = [i for i in status["retention"] if i["setting"] == "audit_retention"]
    assert kept["rows"] == 2


def test_status_shows_what_each_item_holds(seeded: Seeded, monkeypatch: pytest.MonkeyPatch) -> None:
    result = cli(seeded, "status", "--json")
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    by = {i["setting"]: i for i in status["retention"]}
    assert list(by) == [i.setting for i in ITEMS]
    assert set(by["dead_letter_retention"]) == {
        "item",
        "setting",
        "setting_s",
        "rows",
        "oldest_age_s",
    }
    for setting, rows, older_than in [
        ("duplicate_detection_window", 2, 2 * DAY),
        ("inbox_retention", 2, 8 * DAY),
        ("dead_letter_retention", 2, 31 * DAY),
        ("claim_retention", 2, 8 * DAY),
        ("sample_retention", 2, 9 * DAY),
        ("replay_retention", 2, 31 * DAY),  # the finished ones; not the unfinished
        ("audit_retention", 2, 31 * DAY),
    ]:
        assert by[setting]["rows"] == rows, by[setting]
        age = by[setting]["oldest_age_s"]
        assert older_than.total_seconds() <= age < (older_than + DAY).total_seconds(), by[setting]
    assert by["dead_letter_retention"]["setting_s"] == 30 * DAY.total_seconds()
    assert by["compact_every"]["setting_s"] is None
    with Outbox.open(seeded.ws, transport="memory", sql_url=seeded.url, create=False) as ob:
        rows = ob.store._query("SELECT count(*) AS n FROM t").column("n").to_pylist()
    assert by["compact_every"]["rows"] == rows[0] > 4  # every row, before the fold
    assert by["log_retention"]["rows"] > 0
    assert by["log_retention"]["oldest_age_s"] >= DAY.total_seconds()
    assert status["problems"] == []

    plain = cli(seeded, "status")
    assert plain.exit_code == 0, plain.output
    lines = plain.stdout.splitlines()
    start = lines.index("# retention (what is kept: docs/operations.md, Retention)")
    rows = lines[start + 2 : start + 2 + len(ITEMS)]
    assert re.match(
        r"dead letters \(SQL queue\) +dead_letter_retention = 720h00m +2 +7\d\dh", rows[4]
    )
    assert re.match(
        r"finished replays and their chunk records +replay_retention = 720h00m +2 +7\d\dh", rows[7]
    )

    monkeypatch.setattr(output, "is_terminal", lambda: True)
    rich = cli(seeded, "status")
    assert rich.exit_code == 0, rich.output
    assert "retention (what is kept" in rich.stdout
    assert re.search(
        r"│ dead letters \(SQL queue\) +│ dead_letter_retention = 720h00m +│ 2 ", rich.stdout
    )


def test_the_docs_table_is_the_registry_and_every_item_has_a_pruner_and_a_check() -> None:
    text = DOCS.read_text()
    block = re.search(r"<!-- retention -->\n(.*?)<!-- /retention -->", text, re.S)
    assert block is not None, "docs/operations.md has no retention block"
    assert block.group(1) == docs_table(), "regenerate it from outbox.app.retention.docs_table()"
    for item in ITEMS:
        assert type(item).prune is not Item.prune, f"{item.name} has no pruner"
        assert type(item).describe is not Item.describe, f"{item.name} has no describe"
        assert item.setting in CHECKS, f"{item.name} has no test"
    assert set(DISABLED) == set(CHECKS)


@pytest.mark.parametrize("setting", sorted(DISABLED))
def test_a_disabled_pruner_fails_its_check(
    seeded_once: Seeded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    """Each pruner removed in turn (``tests.mutate``): its check fails, the others still pass
    (so the check fails for the pruner, not for a broken seed)."""
    s = _copy(seeded_once, tmp_path)
    target, edits = DISABLED[setting]
    owner, attr, broken = mutated(target, edits)
    monkeypatch.setattr(owner, attr, broken)
    report = _maintain(s)
    with pytest.raises(AssertionError):
        CHECKS[setting](s, report)
    for other, check in CHECKS.items():
        if other != setting:
            check(s, report)
