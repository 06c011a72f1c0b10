"""Gateways: long-running processes that serve devices from the SQL queue (``mqtt``: devices that
handle one task at a time and ack each on a reply topic)."""
