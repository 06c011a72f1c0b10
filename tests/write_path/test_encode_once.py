"""A unit of work encodes each document's state once per save (issue 19: it was up to three
times: the change check, the serializability check, the MERGE source)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outbox.app import Outbox


def test_each_state_is_encoded_once_per_save(ob: Outbox, monkeypatch: pytest.MonkeyPatch) -> None:
    with ob.unit_of_work() as uow:
        uow.create("a", type="t", state={"n": 0})
    encoded: list[Any] = []
    real = json.dumps

    def counting(value: Any, *a: Any, **k: Any) -> str:
        if isinstance(value, dict) and "n" in value:  # a state, not a header or a body
            encoded.append(value)
        return real(value, *a, **k)

    monkeypatch.setattr(json, "dumps", counting)  # the one json module the store's schema uses
    with ob.unit_of_work() as uow:
        doc = uow.get("a")
        assert doc is not None
        encoded.clear()  # the read's encoding is the "before" the change check compares with
        doc.state["n"] = 1
    assert encoded == [{"n": 1}]
    _, rows = ob.store.read(["a"])
    assert rows["a"].state == {"n": 1}
