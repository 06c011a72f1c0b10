"""Contract suites: one abstract pytest class per protocol a third party may implement.

Each module holds a plain class whose ``test_*`` methods pytest collects once a test module
subclasses it (as ``Test<Backend>``) and fills in the abstract factory. ``supports_*`` (or similar)
class attributes are feature flags: a backend sets False for what it does not claim, and those
tests skip with a message that names the flag.

- ``transport.TransportContract`` - ``dispatcher.transports.base.Transport``
- ``queue.QueueContract`` - the durable queue (``dispatcher.queue.SqlQueue``'s surface)
- ``checkpoint_store.CheckpointStoreContract`` - ``rescuer.checkpoint.CheckpointStore``
- ``inbox.InboxContract`` - ``dispatcher.queue.inbox.Inbox`` (a consumer's handled message ids)
- ``claim_log.ClaimLogContract`` - ``dispatcher.claims.ClaimLog`` (two regions' claims)
- ``command_sink.CommandSinkContract`` - ``rescuer.sink.CommandSink``
- ``rescuer_engine.RescuerEngineContract`` - ``rescuer.planner.Engine``, through whole passes

The modules import pytest, so this package is only imported by test code; nothing in the
product imports it.
"""
