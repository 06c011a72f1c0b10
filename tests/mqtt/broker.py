"""The tests' mosquitto: the kit's ``outbox.testing.mosquitto`` (kept importable from here)."""

from outbox.testing.mosquitto import MosquittoServer, mosquitto_binary

__all__ = ["MosquittoServer", "mosquitto_binary"]
