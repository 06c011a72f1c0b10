"""The testing kit: contract suites, fault injection and crash points for delta-outbox backends."""
