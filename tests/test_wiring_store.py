"""One place builds every part, the document store included (issue 43, item 4): the wiring layer
opens it (``open_document_store``, ``Backends.document_store``) with every argument the settings
give, and no entry point constructs one of its own.

Before, nine call sites built ``DeltaDocumentStore`` with different arguments: the rescuer's and
the Spark job's store ignored ``max_commit_retries`` and ``group_commit``."""

from __future__ import annotations

import ast
from pathlib import Path

from outbox import Outbox
from outbox.app.rescue import open_rescuer
from outbox.core.settings import Settings
from outbox.wiring.backends import Backends, open_document_store

REPO = Path(__file__).resolve().parents[1]


def _constructions(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name | ast.Attribute)
        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
        == "DeltaDocumentStore"
    ]


def test_only_the_wiring_constructs_the_document_store() -> None:
    """The kit (``outbox.testing``: contract suites over bare tables) is not an entry point."""
    found = []
    for root in ("outbox", "dispatcher", "rescuer", "migrations"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path.is_relative_to(REPO / "outbox" / "wiring") or path.is_relative_to(
                REPO / "outbox" / "testing"
            ):
                continue
            found += [
                f"{path.relative_to(REPO)}:{n}" for n in _constructions(ast.parse(path.read_text()))
            ]
    found += [f"cli.py:{n}" for n in _constructions(ast.parse((REPO / "cli.py").read_text()))]
    assert found == [], "get the store from outbox.wiring (open_document_store, Backends)"


def test_the_scan_finds_a_construction() -> None:
    code = "s = DeltaDocumentStore(uri)\nt = store.DeltaDocumentStore(uri, clock=c)\nu = f(x)\n"
    assert _constructions(ast.parse(code)) == [1, 2]


def _settings(tmp_path: Path) -> Settings:
    Outbox.open(tmp_path / "ws", transport="memory").close()  # the table and the queue exist
    return Settings.load(
        tmp_path / "ws", env={}, transport="memory", max_commit_retries=3, group_commit=False
    )


def test_every_store_gets_the_settings_arguments(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    store = open_document_store(settings)
    assert (store.uri, store.group_commit, store._max_retries) == (settings.table_uri, False, 3)
    rescuer = open_rescuer(settings)
    try:  # it used to open its store with the defaults (10 retries, group commit on)
        assert (rescuer.store.group_commit, rescuer.store._max_retries) == (False, 3)
    finally:
        rescuer.close()
    with Outbox.open(settings=settings) as ob:
        assert (ob.store.group_commit, ob.store._max_retries) == (False, 3)


def test_backends_build_the_store_once_and_close_it(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    backends = Backends(settings)
    store = backends.document_store()
    assert backends.document_store() is store
    assert backends.built("document_store") is store
    backends.close()
    assert store._closed
