"""The ack protocol between a gateway and its devices: which device a topic names, and which
message an ack names. Shared by the gateway and the kit's device simulator, so both read and
write the same thing."""

from __future__ import annotations

import json
from collections.abc import Callable


def ack_payload(message_id: str) -> bytes:
    """What a device publishes on its ack topic: ``{"message_id": ...}``."""
    return json.dumps({"message_id": message_id}).encode()


def ack_id(payload: bytes) -> str | None:
    """The message id an ack carries (JSON ``message_id``/``id``, or the bare id)."""
    text = payload.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return None
        value = data.get("message_id", data.get("id")) if isinstance(data, dict) else None
        return value if isinstance(value, str) and value else None
    return text or None


def ack_problem(payload: bytes) -> str:
    """Why ``payload`` names no message id (for the one log line a bad ack gets)."""
    text = payload.decode("utf-8", "replace").strip()
    if not text:
        return "empty"
    if text.startswith("{"):
        try:
            json.loads(text)
        except ValueError:
            return "not JSON"
    return "no message id"


def session_matcher(template: str) -> Callable[[str], str | None]:
    """The ``{session}`` level of a topic made from ``template``, or None if it is not one."""
    before, _, after = template.partition("{session}")

    def match(topic: str) -> str | None:
        if not (topic.startswith(before) and topic.endswith(after)):
            return None
        middle = topic[len(before) : len(topic) - len(after)]
        return middle if middle and "/" not in middle else None

    return match
