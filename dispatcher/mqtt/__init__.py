"""MQTT, all of it in one place: the transport (``transport``, over the shared connection
``client``) and the device gateway (``gateway``: devices that handle one task at a time and ack
each on a reply topic, with its ``acks`` protocol, ``gateway_metrics`` and the ``devices`` view that
``outbox devices`` reads)."""
