"""The erasure proof: a marker in a document's state and messages is found in the table's data,
its change data and the queue database before; after `outbox erase` no reader sees it; after
`outbox maintain` past `log_retention`, no byte of any file holds it (raw and decoded Parquet)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.erasure.scenario import ERASED, KEPT, Scene, build, maintain_later, places, readers_see
from tests.erasure.test_purge import sqlite_without_secure_delete
from tests.objectstore.conftest import Remote
from tests.objectstore.test_object_store import workspace_on


def _prove(scene: Scene) -> None:
    before = places(scene.table_hits())
    assert {"data", "_change_data"} <= before, before
    assert scene.sql_hits(), "the queue database holds the messages before"
    assert scene.queue_rows() >= 2  # queue rows and the dead letter

    erased = scene.cli("erase", "--id", ERASED, "--pending", "drop", "--json")
    assert erased.exit_code == 0, erased.output
    report = json.loads(erased.stdout)
    assert report["erased"] == [ERASED], report
    assert report["rows_removed"] == 3, report  # the folded row, the last version, its mark
    assert readers_see(scene) == {"ids": [KEPT], "rows_with_marker": 0}
    assert scene.queue_rows() == 0
    assert scene.table_hits(), "history still holds it until the trim passes the erase"

    status = json.loads(scene.cli("erase", "--status", "--json").stdout)["erasures"]
    assert [(r["doc_id"], r["phase"]) for r in status] == [(ERASED, "erased")]

    maintained = maintain_later(scene)
    assert [m["finished"] for m in maintained] == [0, 1], maintained
    assert scene.table_hits() == []
    assert scene.sql_hits() == []
    # nor the id: the ledger keeps its hash, the erase commit names none, older commits are gone
    assert scene.table_hits(ERASED) == []
    assert scene.sql_hits(ERASED) == []
    assert readers_see(scene) == {"ids": [KEPT], "rows_with_marker": 0}
    status = json.loads(scene.cli("erase", "--status", "--json").stdout)["erasures"]
    assert [r["phase"] for r in status] == ["done"]
    assert ERASED not in str(status)


def test_erasure_leaves_the_marker_nowhere_on_local_disk(tmp_path: Path) -> None:
    """With SQLite's ``secure_delete`` off by default (builds other than Debian's), so the
    queue rows the dispatch and the dead-lettering deleted before leave their bytes behind."""
    with sqlite_without_secure_delete():
        _prove(build(tmp_path / "ws"))


def test_erasure_leaves_the_marker_nowhere_on_an_object_store(
    remote: Remote, tmp_path: Path
) -> None:
    """The same proof with the table in an Azurite container and an S3 bucket (moto): the
    trim, the sweep and the scan all go through deltalake's object-store layer."""
    ws = workspace_on(remote, tmp_path / "ws")
    _prove(build(ws))
