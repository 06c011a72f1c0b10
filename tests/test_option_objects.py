"""The option objects: each frozen dataclass of a call's knobs has a TypedDict of the same names,
which types the call's keyword arguments (``Consumer(queue, name, handler, inbox=True)``), and a
keyword given with ``options=...`` wins over that field.

mypy checks that every keyword the TypedDict names is a field of the right type (the call does
``dataclasses.replace(options, **keywords)``); this checks the other direction: no field that the
call would not take as a keyword.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dispatcher.queue.consumer_options import ConsumerKeywords, ConsumerOptions
from dispatcher.runtime import RuntimeKeywords, RuntimeOptions
from dispatcher.servicebus.options import ServiceBusQueueKeywords, ServiceBusQueueOptions
from dispatcher.worker import WorkerKeywords, WorkerOptions
from outbox.app.checker.run import CheckKeywords, CheckOptions
from outbox.app.maintenance import MaintenanceKeywords, MaintenanceOptions
from outbox.testing.devices import SimulatorKeywords, SimulatorOptions

PAIRS: list[tuple[type[Any], Any]] = [
    (ConsumerOptions, ConsumerKeywords),
    (RuntimeOptions, RuntimeKeywords),
    (WorkerOptions, WorkerKeywords),
    (ServiceBusQueueOptions, ServiceBusQueueKeywords),
    (CheckOptions, CheckKeywords),
    (MaintenanceOptions, MaintenanceKeywords),
    (SimulatorOptions, SimulatorKeywords),
]


@pytest.mark.parametrize(("options", "keywords"), PAIRS, ids=[o.__name__ for o, _ in PAIRS])
def test_every_option_is_a_keyword_of_the_call(options: type[Any], keywords: Any) -> None:
    fields = {f.name: f.type for f in dataclasses.fields(options)}
    named = {k: getattr(t, "__forward_arg__", t) for k, t in keywords.__annotations__.items()}
    assert named == fields  # names and (as written) types alike
    assert not keywords.__required_keys__  # every keyword optional, as every field has a default
    assert options.__dataclass_params__.frozen
    options()  # every field has a default


def test_a_keyword_wins_over_the_options_object(tmp_path: Any) -> None:
    from dispatcher.queue import Consumer, SqlQueue
    from migrations.sql import upgrade

    url = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url)
    with SqlQueue(url) as queue:
        base = ConsumerOptions(concurrency=3, poll_interval=0.5)
        consumer = Consumer(queue, "q", print, options=base, poll_interval=2.0)
        assert consumer.options == ConsumerOptions(concurrency=3, poll_interval=2.0)
        assert (consumer.concurrency, consumer.poll_interval) == (3, 2.0)
        assert Consumer(queue, "q", print, concurrency=2).options == ConsumerOptions(concurrency=2)
        with pytest.raises(TypeError, match="nope"):
            Consumer(queue, "q", print, nope=1)  # type: ignore[call-arg]
