"""A unit of work encodes each document's state once per save (issue 19: it was up to three
times: the change check, the serializability check, the MERGE source)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outbox.app.facade import Outbox
from outbox.core import model


def test_each_state_is_encoded_once_per_save(ob: Outbox, monkeypatch: pytest.MonkeyPatch) -> None:
    with ob.unit_of_work() as uow:
        uow.create("a", type="t", state={"n": 0})
    encoded: list[Any] = []
    real, real_dumps = model._ENCODER, json.dumps

    def note(value: Any) -> None:
        if isinstance(value, dict) and "n" in value:  # a state, not a header or a body
            encoded.append(value)

    class Counting:
        def encode(self, value: Any) -> str:
            note(value)
            return real.encode(value)

    def dumps(value: Any, *a: Any, **k: Any) -> str:
        note(value)
        return real_dumps(value, *a, **k)

    # both ways a state can be encoded: encode_json's one encoder, and json.dumps (the one json
    # module the store's schema uses, should it encode a state again)
    monkeypatch.setattr(model, "_ENCODER", Counting())
    monkeypatch.setattr(json, "dumps", dumps)
    with ob.unit_of_work() as uow:
        doc = uow.get("a")
        assert doc is not None
        encoded.clear()  # the read's encoding is the "before" the change check compares with
        doc.state["n"] = 1
    assert encoded == [{"n": 1}]
    _, rows = ob.store.read(["a"])
    assert rows["a"].state == {"n": 1}


def test_headers_reuse_the_last_encoding_only_when_truly_equal() -> None:
    """``encode_headers`` returns the last all-text headers' JSON for equal headers; values
    that only compare equal (``True == 1 == 1.0``) and changed dicts get their own."""
    from outbox.core.model import encode_headers

    shared = {"traceparent": "00-aa-bb-01"}
    seen = [
        encode_headers(shared),
        encode_headers(dict(shared)),
        encode_headers({"n": "1"}),
        encode_headers({"n": 1}),
        encode_headers({"n": True}),
        encode_headers({"n": 1.0}),
        encode_headers({"n": "1"}),
    ]
    shared["traceparent"] = "00-cc-dd-01"  # the cache holds a copy, not the caller's dict
    seen.append(encode_headers(shared))
    assert seen == [
        '{"traceparent":"00-aa-bb-01"}',
        '{"traceparent":"00-aa-bb-01"}',
        '{"n":"1"}',
        '{"n":1}',
        '{"n":true}',
        '{"n":1.0}',
        '{"n":"1"}',
        '{"traceparent":"00-cc-dd-01"}',
    ]
