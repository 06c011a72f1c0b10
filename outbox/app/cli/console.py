"""``outbox console``: the operator's pages in a browser (docs/console.md)."""

from __future__ import annotations

import functools
import logging
import signal
import socket
import sys
import threading
from typing import Any
from urllib.parse import parse_qsl

import click

from outbox.app.cli.output import echo, echo_err
from outbox.app.cli.support import CliContext, pass_cli
from outbox.core.errors import ConfigurationError

log = logging.getLogger("outbox.console")


@click.command("console")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Anything but a loopback address exposes the dead letters' "
    "bodies to the network.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free port, printed at start).",
)
@click.option(
    "--token",
    envvar="OUTBOX_CONSOLE_TOKEN",
    metavar="TOKEN",
    help="The token that unlocks requeue and purge (at least 16 characters). Default: a new "
    "one, printed once at start.",
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option(
    "--devices-queue",
    default="devices",
    show_default=True,
    envvar="OUTBOX_GATEWAY_DESTINATION",
    help="The gateway's queue, shown first on the Devices page.",
)
@click.option(
    "--kafka-dead-letters",
    "kafka_topics",
    multiple=True,
    metavar="TOPIC",
    help="A Kafka dead-letter topic to show beside the SQL queue's dead letters (repeatable; "
    "the settings' Kafka connection).",
)
@pass_cli
def console_cmd(
    cli: CliContext,
    *,
    host: str,
    port: int,
    token: str | None,
    read_only: bool,
    devices_queue: str,
    kafka_topics: tuple[str, ...],
) -> None:
    """Serve the operator console: overview (pending work, rescue lag over time, queues,
    devices), dead letters (filter, show, requeue, purge), devices, paused ordering keys (skip a
    gate, open a key) and a document's trace. Stops on Ctrl-C or SIGTERM (exit 0)."""
    try:
        from werkzeug.serving import make_server

        from outbox.app.console import ConsoleConfig, create_app
    except ImportError as e:
        raise ConfigurationError(
            f"outbox console needs Flask ({e.name} is not installed)",
            hint="pip install 'delta-outbox[console]'",
        ) from None
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.app.console import security as sec
    from outbox.app.history import History
    from outbox.app.sampling import Sampler
    from outbox.app.trace import trace
    from outbox.core.clock import SystemClock
    from outbox.core.sql import read_only_url, redact_url

    if token is not None and len(token) < 16:
        raise ConfigurationError(
            "the console token is too short (fewer than 16 characters): anyone on this machine "
            "could guess it",
            hint="leave --token / OUTBOX_CONSOLE_TOKEN out to get a new random one",
        )
    settings = cli.settings()
    clock = SystemClock()
    url = read_only_url(settings.sql_url) if read_only else settings.sql_url
    queue = SqlQueue.from_settings(settings.replace(sql_url=url), clock=clock)
    sampler = None if read_only else Sampler(settings, clock, source="console")
    try:
        # Bound here, not by Werkzeug: its own bind prints two lines and exits on a port in use.
        # Bound before the app is made: the session cookie is named after the port it got.
        listening = _listen(host, port)
        try:
            config = ConsoleConfig(
                queue=queue,
                history=History(queue.database),
                clock=clock,
                token=token or sec.new_token(),
                read_only=read_only,
                host=host,
                port=listening.getsockname()[1],
                table_uri=settings.table_uri,
                sql_url=redact_url(settings.sql_url),
                devices_queue=devices_queue,
                trace=functools.partial(trace, settings.replace(sql_url=url), clock),
                kafka_topics=kafka_topics,
                kafka_dead_letters=_kafka_opener(settings, kafka_topics) if kafka_topics else None,
            )
            app = create_app(config)
            server = make_server(
                host,
                port,
                app,
                threaded=True,
                fd=listening.fileno(),
                request_handler=_handler(),
            )
        finally:
            listening.close()  # the server holds its own copy
        # Ctrl-C and SIGTERM stop it from here on: set before the address is printed, so a
        # supervisor that reads the address and signals at once still gets a clean stop.
        stop = threading.Event()
        previous = {
            sig: signal.signal(sig, lambda *_: stop.set())
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        address = f"http://{_url_host(host)}:{server.socket.getsockname()[1]}/"
        _announce(address, config.token, read_only=read_only, given=token is not None, host=host)
        if sampler is not None:
            sampler.start()
        try:
            _serve(server, stop)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        if sampler is not None:
            sampler.stop()
        queue.close()
    echo_err("console stopped")


def _announce(address: str, token: str, *, read_only: bool, given: bool, host: str) -> None:
    """The address on stdout, and the token once (never again: not in a log, not on a page)."""
    from outbox.app.console.security import is_loopback

    echo(f"outbox console on {address}")
    if read_only:
        echo("read-only: nothing can be changed from it")
    elif given:
        echo("actions need the token given in --token / OUTBOX_CONSOLE_TOKEN")
    else:
        echo(f"actions need this token (shown once): {token}")
        echo(f"or open {address}unlock?token={token}")
    sys.stdout.flush()  # a log or a test reading the pipe sees the address at once
    if not is_loopback(host):
        echo_err(
            f"warning: the console listens on {host}: anyone who can reach it reads the "
            "dead letters' bodies (fix: --host 127.0.0.1 and an SSH tunnel)"
        )


def _serve(server: Any, stop: threading.Event) -> None:
    """Serve until ``stop`` is set (by the signal handlers). The server runs on a thread of its
    own, so the main thread stays free to take the signal (``shutdown`` waits for
    ``serve_forever``)."""
    thread = threading.Thread(target=server.serve_forever, name="console-http", daemon=True)
    thread.start()
    try:
        while not stop.wait(3600):
            pass
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _handler() -> type[Any]:
    """Werkzeug's request handler with its access log line's token masked: the unlock address
    carries the token in its query, and a log is no place for it."""
    from werkzeug.serving import WSGIRequestHandler

    class Handler(WSGIRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            path = self.path  # the request was read long before: only the log line changes
            self.path = _mask_token(path)
            self.requestline = self.requestline.replace(path, self.path)
            try:
                super().log_request(code, size)
            finally:
                self.path = path

    return Handler


def _mask_token(target: str) -> str:
    """A request target with the value of every query parameter masked whose name the console
    reads as ``token``: names are decoded as Werkzeug decodes them, so ``?%74oken=`` (which
    ``/unlock`` accepts) is masked as ``?token=`` is."""
    path, question, query = target.partition("?")
    if not question:
        return target
    parts = []
    for part in query.split("&"):
        read = parse_qsl(part, keep_blank_values=True, errors="replace")
        parts.append(part.partition("=")[0] + "=***" if read and read[0][0] == "token" else part)
    return f"{path}?{'&'.join(parts)}"


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ConfigurationError(
            f"cannot listen on {host}:{port}: {e.strerror or e}",
            hint="choose another --port (0: any free port)",
        ) from None
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def register(group: click.Group) -> None:
    group.add_command(console_cmd)


def _kafka_opener(settings: Any, topics: tuple[str, ...]) -> Any:
    """How the console opens a Kafka dead-letter topic: the settings' Kafka connection. A topic
    name Kafka refuses is one line at start (opening checks the name), not a page error later."""
    from dispatcher.kafka.config import KafkaConfig
    from dispatcher.kafka.dead_letters import KafkaDeadLetters
    from dispatcher.kafka.mapping import topic_problem
    from outbox.core.errors import ValidationError

    for topic in topics:
        if problem := topic_problem(topic):
            raise ValidationError(
                f"--kafka-dead-letters {topic!r} {problem}",
                hint="name the dead-letter topic as Kafka has it, e.g. orders.dlt",
            )
    config = KafkaConfig.from_settings(settings)
    return lambda topic: KafkaDeadLetters(config, topic)
