"""Kafka and Azure Event Hubs (its Kafka endpoint) as a transport, with a consumer helper.

``transport`` sends outbox messages with an idempotent producer; ``consumer`` reads them in a
consumer group, drops repeats through an inbox and dead-letters to a topic; ``config`` turns the
settings (or an Event Hubs connection string) into librdkafka properties; ``mapping`` is the one
place that says which Kafka header carries which message field. docs/kafka.md has the contract.
"""
