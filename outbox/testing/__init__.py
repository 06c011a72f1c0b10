"""The testing kit: contract suites, fault injection and crash points for delta-outbox backends.

Why it ships in the wheel: our ``tests/`` folder does not, yet someone writing a transport, a
command queue, a checkpoint store, a command sink or a rescuer engine needs to prove it keeps the
outbox's invariants (docs/design.md, I1-I6) the way ours do. So the suites we run against every one
of our backends live here, as abstract pytest classes, and our own tests subclass them exactly as a
third party would (eventsourcing ships ``eventsourcing/tests/persistence.py`` the same way;
Watermill ships a universal pub/sub suite with feature flags).

Use, in your own test module (pytest required; the kit's contracts import it)::

    from outbox.testing.contracts.transport import DEST, TransportContract

    class TestMyTransport(TransportContract):
        atomic = False  # a feature flag: clear what your backend does not claim

        def make_transport(self):
            return MyTransport(...)  # must accept DEST and refuse BAD_DEST

        def delivered(self, transport, destination=DEST):
            return ...  # what a consumer of ``destination`` would receive, in order

pytest then collects every ``test_*`` method. A test your backend does not claim skips with a
message naming the flag; the others must pass. Contracts need fixtures only from pytest itself
(``tmp_path``): a backend that needs its own (a database URL) adds an autouse fixture to its
subclass and keeps what it needs on ``self`` for the factory method.

Contents:

- ``contracts.transport`` - ``TransportContract`` for ``dispatcher.transports.base.Transport``
- ``contracts.queue`` - ``QueueContract`` for a durable queue with ``SqlQueue``'s surface
- ``contracts.checkpoint_store`` - ``CheckpointStoreContract`` for ``rescuer.checkpoint``
- ``contracts.inbox`` - ``InboxContract`` for ``dispatcher.queue.inbox.Inbox``, and
  ``InboxConsumerContract``: the consumer over that inbox (one handler per message id at a time)
- ``contracts.command_sink`` - ``CommandSinkContract`` for ``rescuer.sink.CommandSink``
- ``contracts.rescuer_engine`` - ``RescuerEngineContract`` for ``rescuer.planner.Engine``
- ``tables.Table`` - a Delta document table with one-line saves, dispatches and deletes
- ``faulty.FaultyTransport`` - a transport wrapper that fails on command, deterministically
- ``crash_points`` - named steps where a test kills the dispatcher (``install()`` first);
  ``CrashSpec`` arms them in a process the test cannot reach (``SparkOutbox.executor_hook``)
- ``devices.DeviceSimulator`` - MQTT devices that handle one task at a time and ack each (drops,
  doubles, offline spells); records each device's most tasks in flight at once (needs ``[mqtt]``)
- ``mosquitto.MosquittoServer`` - a throwaway mosquitto on 127.0.0.1 (``outbox demo devices``)
- ``servicebus_fake`` - the Service Bus SDK's clients, in memory (needs ``[azure]``)

Not here: our own proving ground (the device fleet, the Kafka broker, the browser kit, the
console's data builders) is ``testkit/`` in the repository, which the wheel does not ship and no
shipped module imports (docs/development.md, "The test kit and the proving ground").

Importing ``outbox.testing`` itself imports nothing: pick the module you need.
"""
