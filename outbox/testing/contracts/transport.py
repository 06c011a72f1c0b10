"""The transport contract: every ``Transport`` passes these tests (Watermill's universal suite).

Why it ships: a third party's transport is only safe under the outbox if ``send`` settles every
message before it returns, keeps each session's order, tolerates re-sends with the same id and
names the message it refused. A backend subclasses ``TransportContract`` in its own test module,
provides ``make_transport`` and ``delivered`` (what a consumer of ``destination`` would receive,
in acceptance order), and clears the feature flags it does not claim; pytest collects the rest.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from dispatcher.transports.base import Transport, TransportMessage
from outbox.core.errors import PermanentTransportError, RetryableTransportError
from outbox.testing.faulty import FaultyTransport

#: The destination every contract test sends to; ``make_transport`` must accept it.
DEST = "contract-dest"
#: A destination the transport must refuse with ``PermanentTransportError``.
BAD_DEST = "no such destination!"


def msg(i: int, session: str = "s1", **kw: object) -> TransportMessage:
    """Message ``i`` of ``session``: its id is ``m-<session>-<i>``."""
    fields: dict[str, object] = {
        "message_id": f"m-{session}-{i}",
        "destination": DEST,
        "body": f'{{"i":{i}}}'.encode(),
        "subject": "Thing",
        "session_id": session,
    }
    fields.update(kw)
    return TransportMessage(**fields)  # type: ignore[arg-type]


class TransportContract:
    """Subclass as ``Test<YourTransport>``; override ``make_transport`` and ``delivered``."""

    #: the transport takes a batch all-or-nothing (False: atomic per destination only)
    atomic = True
    #: one instance may be used by several threads at once
    thread_safe = True

    def make_transport(self) -> Transport:
        """A fresh transport that knows ``DEST`` and refuses ``BAD_DEST``."""
        raise NotImplementedError

    def delivered(self, transport: Transport, destination: str = DEST) -> list[TransportMessage]:
        """Everything ``transport`` accepted for ``destination``, in acceptance order."""
        raise NotImplementedError

    def test_send_settles_and_keeps_every_field(self) -> None:
        t = self.make_transport()
        when = datetime(2020, 1, 1, tzinfo=UTC)  # in the past: deliverable at once
        m = msg(
            1,
            content_type="application/json",
            correlation_id="corr-1",
            headers={"traceparent": "00-abc-def-01", "tenant": "t1"},
            scheduled_at=when,
        )
        t.send([m])
        delivered = self.delivered(t)
        assert [d.message_id for d in delivered] == [m.message_id], "exactly one copy is held"
        got = delivered[0]
        assert got.message_id == m.message_id
        assert got.body == m.body
        assert got.subject == "Thing"
        assert got.session_id == "s1"
        assert got.content_type == "application/json"
        assert got.correlation_id == "corr-1"
        assert got.headers == m.headers

    def test_batch_order_is_kept_per_session(self) -> None:
        t = self.make_transport()
        batch = [msg(i, s) for i in range(1, 6) for s in ("a", "b")]
        t.send(batch)
        got = self.delivered(t)
        for s in ("a", "b"):
            assert [g.message_id for g in got if g.session_id == s] == [
                f"m-{s}-{i}" for i in range(1, 6)
            ]

    def test_empty_batch_is_a_no_op(self) -> None:
        t = self.make_transport()
        t.send([])
        assert self.delivered(t) == []

    def test_resend_with_same_id_never_fails_and_copies_share_the_id(self) -> None:
        t = self.make_transport()
        t.send([msg(1), msg(2)])
        t.send([msg(1), msg(2)])
        got = self.delivered(t)
        assert {g.message_id for g in got} == {"m-s1-1", "m-s1-2"}
        firsts = list(dict.fromkeys(g.message_id for g in got))
        assert firsts == ["m-s1-1", "m-s1-2"]

    def test_refused_message_is_named_and_a_batch_is_all_or_nothing(self) -> None:
        t = self.make_transport()
        bad = msg(2, destination=BAD_DEST)
        with pytest.raises(PermanentTransportError) as err:
            t.send([msg(1), bad, msg(3)])
        assert err.value.message_id == bad.message_id
        assert bad.message_id in str(err.value)
        if self.atomic:
            assert self.delivered(t) == []

    def test_concurrent_senders_lose_nothing_and_keep_session_order(self) -> None:
        if not self.thread_safe:
            pytest.skip("the transport does not claim thread safety (thread_safe = False)")
        t = self.make_transport()

        def sender(s: str) -> None:
            for i in range(1, 11):
                t.send([msg(i, s)])

        threads = [threading.Thread(target=sender, args=(f"s{k}",)) for k in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        got = self.delivered(t)
        assert len(got) == 60
        for k in range(6):
            ids = [g.message_id for g in got if g.session_id == f"s{k}"]
            assert ids == [f"m-s{k}-{i}" for i in range(1, 11)]

    def test_faulty_wrapper_fails_as_told_and_sends_nothing(self) -> None:
        t = FaultyTransport(self.make_transport(), seed=1)
        t.fail_nth(1)
        with pytest.raises(RetryableTransportError) as err:
            t.send([msg(1), msg(2)])
        assert err.value.message_id == "m-s1-1"
        t.fail_destination(DEST, permanent=True)
        with pytest.raises(PermanentTransportError):
            t.send([msg(1)])
        t.heal()
        t.outage()
        with pytest.raises(RetryableTransportError, match="outage"):
            t.send([msg(1)])
        t.outage(False)
        t.send([msg(1), msg(2)])
        assert [g.message_id for g in self.delivered(t.inner)] == ["m-s1-1", "m-s1-2"]
        assert (t.calls, t.failures) == (4, 3)
