"""The stories ``outbox demo`` tells: ``shipments`` (the main job on the embedded default, a crash
and its rescue), ``geo`` (two regions and a claim log) and ``devices`` (an MQTT fleet)."""
