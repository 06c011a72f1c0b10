"""The MQTT 5 framing a simulated device speaks: packet types, reading a packet off a stream,
variable byte integers and the user properties of a PUBLISH (MQTT 5, 2.1-2.2).

Why apart: it is pure bytes, no device state; only what a device needs (QoS 0/1, no QoS 2, no
topic aliases) is spoken, so it is no client anyone else should use.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Final

from dispatcher.mqtt.client import mqtt_string, mqtt_varint

# Packet types (MQTT 5, 2.1.2), the high nibble of a packet's first byte.
CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 12, 13, 14
PINGREQ_PACKET: Final = b"\xc0\x00"
DISCONNECT_PACKET: Final = b"\xe0\x00"  # reason 0, normal disconnection: the will is dropped
USER_PROPERTY: Final = 0x26
# Property ids by value type (MQTT 5, 2.2.2.2): anything else is a UTF-8 string or binary data
# (2-byte length, then the bytes), or the user property (two of those).
BYTE_PROPS: Final = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
TWO_BYTE_PROPS: Final = frozenset({0x13, 0x21, 0x22, 0x23})
FOUR_BYTE_PROPS: Final = frozenset({0x02, 0x11, 0x18, 0x27})
VBI_PROPS: Final = frozenset({0x0B})
LENGTH_PROPS: Final = frozenset({0x03, 0x08, 0x09, 0x12, 0x15, 0x16, 0x1A, 0x1C, 0x1F})


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One packet: its first byte (type and flags) and its body."""
    head = await reader.readexactly(2)
    length, byte, shift = head[1] & 0x7F, head[1], 7
    while byte & 0x80:
        if shift > 21:
            raise OSError("malformed remaining length")
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
    return head[0], (await reader.readexactly(length) if length else b"")


def read_vbi(data: bytes, pos: int) -> tuple[int, int]:
    """A variable byte integer at ``pos``: its value and the position after it."""
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + mqtt_varint(len(body)) + body


def encode_bytes(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def user_properties(props: bytes) -> dict[str, str]:
    """The user properties among a packet's properties (the others skipped by their type)."""
    found: dict[str, str] = {}
    pos = 0
    while pos < len(props):
        ident = props[pos]
        pos += 1
        if ident in BYTE_PROPS:
            pos += 1
        elif ident in TWO_BYTE_PROPS:
            pos += 2
        elif ident in FOUR_BYTE_PROPS:
            pos += 4
        elif ident in VBI_PROPS:
            _, pos = read_vbi(props, pos)
        elif ident in LENGTH_PROPS:
            (size,) = struct.unpack_from("!H", props, pos)
            pos += 2 + size
        elif ident == USER_PROPERTY:
            (size,) = struct.unpack_from("!H", props, pos)
            key = props[pos + 2 : pos + 2 + size].decode("utf-8", "replace")
            pos += 2 + size
            (size,) = struct.unpack_from("!H", props, pos)
            found.setdefault(key, props[pos + 2 : pos + 2 + size].decode("utf-8", "replace"))
            pos += 2 + size
        else:
            raise OSError(f"unknown MQTT property 0x{ident:02x}")
    return found


def connect(
    client_id: str,
    *,
    keepalive: int,
    will_topic: str,
    will: bytes,
    username: str | None,
    password: str | None,
) -> bytes:
    """CONNECT: MQTT 5, clean start, the will (``will``, QoS 1, retained) on ``will_topic``."""
    flags = 0x02 | 0x04 | 0x08 | 0x20  # clean start, will, will QoS 1, will retain
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    header = mqtt_string("MQTT") + struct.pack("!BBHB", 5, flags, keepalive, 0)
    payload = (
        mqtt_string(client_id)
        + b"\x00"  # will properties: none
        + mqtt_string(will_topic)
        + encode_bytes(will)
    )
    if username is not None:
        payload += mqtt_string(username)
    if password is not None:
        payload += mqtt_string(password)
    return packet(CONNECT << 4, header + payload)
