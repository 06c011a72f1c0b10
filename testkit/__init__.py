"""The proving ground: what delta-outbox's own tests and benchmarks run on, kept out of the wheel.

Why not in ``outbox.testing``: the package ships what users run and what they test their own
backends with (the contract suites and fakes in ``outbox.testing``); these are our tools for
proving the product, not a user's. pyproject.toml's wheel selection leaves this package out
(``tests/test_packaging.py`` checks the wheel's files), and an import-linter contract keeps every
shipped package from importing it (``tests/test_architecture.py`` shows it fails when one does).
It is importable from a checkout: the tests, ``benchmarks/`` and ``scripts/`` run from the
repository's root.

Contents:

- ``fleet`` - ``DeviceFleet``: thousands of MQTT 5 devices, a connection and a Last Will each
- ``kafka`` - ``KafkaBroker``: a throwaway one-node Kafka broker (KRaft) on 127.0.0.1
- ``browser`` - headless Chromium through Selenium, and ``outbox console`` started as a user does
- ``console`` - bulk builders of dead letters, devices and samples for the console's tests and
  benchmark
"""
