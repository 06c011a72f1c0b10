"""One MQTT connection (paho-mqtt 2.x, MQTT 5) shared by the MQTT transport, the device gateway and
the kit's device simulator: broker URLs, settled QoS 1 publishes, subscriptions that survive
reconnects, and paho's errors translated to ours.

Why one wrapper: paho reports a PUBACK's reason code only to the ``on_publish`` callback and marks a
refused message "published" all the same, it queues a QoS 1 publish made while disconnected and
sends it whenever the connection comes back, and it forgets subscriptions when a clean session
reconnects. Each of those would be a silent bug in three places; here they are handled once:
``publish`` refuses at once while disconnected (nothing is left queued to surprise a device
later), waits for every PUBACK and raises ``PermanentTransportError`` for a refused message, and
``on_connect`` subscribes again after every (re)connect.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from outbox.core.errors import (
    ConfigurationError,
    MissingDependencyError,
    PermanentTransportError,
    RetryableTransportError,
    TransportUnavailableError,
)

if TYPE_CHECKING:
    from paho.mqtt.client import Client, MQTTMessage, MQTTMessageInfo

log = logging.getLogger("outbox.mqtt")

INSTALL_HINT = "pip install 'delta-outbox[mqtt]' (paho-mqtt 2.x)"
#: PUBACK reason codes after which the same publish can succeed later (MQTT 5, 3.4).
RETRYABLE_PUBACK = {0x91: "packet identifier in use", 0x97: "quota exceeded"}


def load_paho() -> Any:
    """``paho.mqtt.client``, or ``MissingDependencyError`` naming the extra to install."""
    try:
        import paho.mqtt.client as mqtt
    except ImportError as e:
        raise MissingDependencyError(
            f"MQTT needs the paho-mqtt package ({e})", hint=INSTALL_HINT
        ) from e
    return mqtt


@dataclass(frozen=True)
class MqttBroker:
    """Where the broker is and how to log in: ``mqtt://host:port`` or ``mqtts://`` (TLS)."""

    host: str
    port: int = 1883
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    insecure: bool = False  # TLS without checking the broker's name (test brokers only)

    @classmethod
    def parse(
        cls,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: bool | None = None,
        ca_file: str | None = None,
        insecure: bool = False,
    ) -> MqttBroker:
        """``mqtt://[user[:password]@]host[:port]`` (1883) or ``mqtts://...`` (8883, TLS).
        Explicit ``username``/``password``/``tls`` win over the URL's."""
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl") or not parts.hostname:
            raise ConfigurationError(
                f"broker {url!r} is not an MQTT URL",
                hint="use mqtt://host:port, or mqtts://host:port for TLS",
            )
        secure = parts.scheme in ("mqtts", "ssl") if tls is None else tls
        try:
            port = parts.port or (8883 if secure else 1883)
        except ValueError as e:
            raise ConfigurationError(
                f"broker {url!r} has an invalid port", hint="use mqtt://host:1883"
            ) from e
        return cls(
            host=parts.hostname,
            port=port,
            tls=secure or ca_file is not None,
            username=username or (unquote(parts.username) if parts.username else None),
            password=password or (unquote(parts.password) if parts.password else None),
            ca_file=ca_file,
            insecure=insecure,
        )

    @property
    def url(self) -> str:
        """The URL without credentials (for logs)."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Publish:
    """One QoS 1 publish: topic, payload and MQTT 5 properties."""

    topic: str
    payload: bytes
    label: str  # what an error names: the message id
    content_type: str | None = None
    correlation_data: bytes | None = None
    user_properties: Sequence[tuple[str, str]] = ()
    retain: bool = False


OnMessage = Callable[["MQTTMessage"], None]


class PackedProperties:
    """A PUBLISH's MQTT 5 properties, packed once (MQTT 5, 3.3.2.3). paho's ``Properties`` took
    about 80 µs per message to build and pack, most of a gateway's publish; paho only calls
    ``pack()`` on what it is given (and prints it in debug logs)."""

    __slots__ = ("_packed",)

    def __init__(self, item: Publish) -> None:
        out = bytearray()
        if item.content_type:
            out += b"\x03" + mqtt_string(item.content_type)
        if item.correlation_data is not None:
            out += b"\x09" + len(item.correlation_data).to_bytes(2, "big") + item.correlation_data
        for key, value in item.user_properties:
            out += b"\x26" + mqtt_string(key) + mqtt_string(value)
        self._packed = mqtt_varint(len(out)) + bytes(out)

    def pack(self) -> bytes:
        return self._packed

    def __repr__(self) -> str:
        return f"<properties, {len(self._packed)} bytes>"


def mqtt_string(text: str) -> bytes:
    """A UTF-8 string as MQTT writes it: a 2-byte length, then the bytes (1.5.4)."""
    data = text.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError(f"an MQTT string is at most 65,535 bytes, not {len(data)}")
    return len(data).to_bytes(2, "big") + data


def mqtt_varint(n: int) -> bytes:
    """MQTT's variable byte integer (1.5.5)."""
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


class MqttConnection:
    """A connected paho client with its network thread; ``close()`` stops both.

    Thread safe: any thread may ``publish``; ``on_message`` runs on paho's network thread, so it
    must be quick (hand work to another thread) and must not publish and wait.
    """

    def __init__(
        self,
        broker: MqttBroker,
        *,
        client_id: str | None = None,
        subscriptions: Sequence[str] = (),
        on_message: OnMessage | None = None,
        connect_timeout: float = 10.0,
        max_inflight: int = 1000,
        wait: bool = True,
    ) -> None:
        mqtt = load_paho()
        from paho.mqtt.enums import CallbackAPIVersion

        self.broker = broker
        self.client_id = client_id or f"outbox-{uuid.uuid4().hex[:12]}"
        self._subscriptions = list(subscriptions)
        self._on_message = on_message
        self._connected = threading.Event()
        self._answered = threading.Event()  # a CONNACK came, accepting or refusing
        self._refused: str | None = None
        self._results: dict[int, Any] = {}  # mid -> PUBACK reason code
        self._guard = threading.Lock()
        self._closed = False
        client: Client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=True,
        )
        client.max_inflight_messages_set(max_inflight)
        client.reconnect_delay_set(min_delay=1, max_delay=2)
        if broker.username is not None:
            client.username_pw_set(broker.username, broker.password)
        if broker.tls:
            client.tls_set(ca_certs=broker.ca_file, cert_reqs=ssl.CERT_REQUIRED)
            if broker.insecure:
                client.tls_insecure_set(True)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_publish = self._handle_publish
        client.on_message = self._handle_message
        self._client = client
        try:
            client.connect_async(broker.host, broker.port, keepalive=30)
        except (OSError, ValueError) as e:
            raise ConfigurationError(
                f"cannot use MQTT broker {broker.url}: {e}", hint="check --broker"
            ) from e
        client.loop_start()
        if wait:
            self._answered.wait(connect_timeout)  # a refusal needs no waiting out the timeout
        if wait and not self.connected:
            why = self._refused or "no answer"
            self.close()
            raise TransportUnavailableError(
                f"MQTT broker {broker.url} did not accept a connection within "
                f"{connect_timeout:g}s ({why})",
                hint="check that the broker runs and the address, TLS and credentials are right",
            )

    # --- paho callbacks (network thread) ------------------------------------------------------

    def _handle_connect(
        self, client: Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        if reason.is_failure:
            self._refused = f"refused: {reason}"
            self._answered.set()
            log.warning("MQTT broker %s refused the connection: %s", self.broker.url, reason)
            return
        self._refused = None
        for topic in self._subscriptions:  # a clean session forgets them on every reconnect
            client.subscribe(topic, qos=1)
        self._connected.set()
        self._answered.set()
        log.debug("connected to %s as %s", self.broker.url, self.client_id)

    def _handle_disconnect(
        self, _client: Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        self._connected.clear()
        if not self._closed:
            log.warning("MQTT connection to %s lost: %s", self.broker.url, reason)

    def _handle_publish(
        self, _client: Client, _userdata: Any, mid: int, reason: Any, _props: Any
    ) -> None:
        with self._guard:
            self._results[mid] = reason

    def _handle_message(self, _client: Client, _userdata: Any, message: MQTTMessage) -> None:
        if self._on_message is None:
            return
        try:
            self._on_message(message)
        except Exception:  # never kill paho's network thread
            log.exception("MQTT message handler failed on %s", message.topic)

    # --- use ----------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def subscribe(self, topic: str) -> None:
        """Subscribe now and after every reconnect (QoS 1)."""
        self._subscriptions.append(topic)
        if self.connected:
            self._client.subscribe(topic, qos=1)

    def publish(self, items: Sequence[Publish], *, timeout: float = 10.0) -> None:
        """Publish every item at QoS 1 (pipelined) and return once each has its PUBACK.

        ``RetryableTransportError`` when the broker is not connected, the PUBACKs do not come
        within ``timeout`` or the broker says retry; ``PermanentTransportError`` when it refused
        an item (not authorized, topic invalid, too large). Either names the first failed item.
        """
        if not items:
            return
        self._check_can_publish(items[0])
        infos = [(item, self._publish_one(item)) for item in items]
        self._await_pubacks(infos, timeout)
        self._check_reasons(infos)

    def _check_can_publish(self, first: Publish) -> None:
        if self._closed:
            raise TransportUnavailableError(
                f"message {first.label}: the MQTT connection is closed", message_id=first.label
            )
        if not self.connected:  # paho would queue it and send it whenever it reconnects
            raise TransportUnavailableError(
                f"message {first.label}: not connected to MQTT broker {self.broker.url}",
                message_id=first.label,
                hint="the broker is down or unreachable; the message is sent again later",
            )

    def _publish_one(self, item: Publish) -> MQTTMessageInfo:
        """Hand one item to paho (QoS 1), its MQTT 5 properties set."""
        try:
            props: Any = PackedProperties(item)
            return self._client.publish(item.topic, item.payload, 1, item.retain, props)
        except ValueError as e:  # invalid topic, payload over 256 MiB
            raise PermanentTransportError(
                f"message {item.label}: MQTT refuses it: {e}", message_id=item.label
            ) from e

    def _await_pubacks(
        self, infos: Sequence[tuple[Publish, MQTTMessageInfo]], timeout: float
    ) -> None:
        """Wait until every publish has its PUBACK, within ``timeout`` for them all."""
        deadline = time.monotonic() + timeout
        for item, info in infos:
            try:
                info.wait_for_publish(max(0.0, deadline - time.monotonic()))
            except (RuntimeError, ValueError) as e:
                raise RetryableTransportError(
                    f"message {item.label}: MQTT publish failed: {e}", message_id=item.label
                ) from e
            if not info.is_published():
                raise TransportUnavailableError(
                    f"message {item.label}: no PUBACK from {self.broker.url} within {timeout:g}s",
                    message_id=item.label,
                    hint="the broker is slow or the connection dropped; send again later",
                )

    def start_publish(self, items: Sequence[Publish]) -> list[MQTTMessageInfo]:
        """Publish every item at QoS 1 without waiting; ``outcome`` says later how each went.
        ``RetryableTransportError`` at once when the broker is not connected."""
        if not items:
            return []
        self._check_can_publish(items[0])
        return [self._publish_one(item) for item in items]

    def outcome(self, item: Publish, info: MQTTMessageInfo) -> tuple[bool, Exception | None]:
        """(settled, error) of a publish ``start_publish`` made: not settled while its PUBACK has
        not come; settled with the refusal as an error when the broker refused it, and with a
        retryable error when paho never sent it (the connection dropped between the connected
        check and the publish: paho then raises from ``is_published``, which ended a gateway)."""
        try:
            published = info.is_published()
        except (RuntimeError, ValueError) as e:  # rc NO_CONN, or paho's queue full
            return True, RetryableTransportError(
                f"message {item.label}: MQTT publish failed: {e}", message_id=item.label
            )
        if not published:
            return False, None
        with self._guard:
            reason = self._results.pop(info.mid, None)
        if reason is None or not reason.is_failure:
            return True, None
        why = f"message {item.label}: MQTT broker {self.broker.url} refused it: {reason}"
        if reason.value in RETRYABLE_PUBACK:
            return True, RetryableTransportError(why, message_id=item.label)
        return True, PermanentTransportError(why, message_id=item.label)

    def _check_reasons(self, infos: Sequence[tuple[Publish, MQTTMessageInfo]]) -> None:
        """Raise for the first item the broker refused (its PUBACK's reason code)."""
        with self._guard:
            reasons = [(item, self._results.pop(info.mid, None)) for item, info in infos]
        for item, reason in reasons:
            if reason is None or not reason.is_failure:
                continue
            why = f"message {item.label}: MQTT broker {self.broker.url} refused it: {reason}"
            if reason.value in RETRYABLE_PUBACK:
                raise RetryableTransportError(why, message_id=item.label)
            raise PermanentTransportError(why, message_id=item.label)

    def publish_nowait(self, topic: str, payload: bytes) -> None:
        """A QoS 1 publish not waited for (a device's ack from the network thread)."""
        self._client.publish(topic, payload, qos=1)

    def close(self) -> None:
        self._closed = True
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
