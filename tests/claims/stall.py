"""A TCP proxy on 127.0.0.1 that can play a server that hangs: it accepts, reads nothing and
answers nothing, on the connections already open and on new ones alike.

Why a proxy and not the Cosmos-protocol server itself: that server cannot be told to hang, and a
hang on an *open* connection is the case that matters (the SDK's read timeout, 65 s by default,
governs it; a refused connection fails at once anyway).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class StallingProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target``, except between ``stall()`` and
    ``resume()``."""

    def __init__(self, target: int) -> None:
        self._target = ("127.0.0.1", target)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._stalled = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        threading.Thread(target=self._accept, name="stall-proxy", daemon=True).start()

    def stall(self) -> None:
        """Hang every connection, open or new: read nothing, answer nothing."""
        self._stalled.set()

    def resume(self) -> None:
        """Drop the connections of the hang unanswered (the server never saw their requests)
        and forward again."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            _close(*pair)
        self._stalled.clear()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            _close(*pair)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target)
            except OSError:
                if self._closed.is_set():
                    return
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        other = {client: upstream, upstream: client}
        try:
            while not self._closed.is_set():
                if self._stalled.is_set():  # read nothing, answer nothing
                    self._closed.wait(0.02)
                    continue
                readable, _, _ = select.select([client, upstream], [], [], 0.05)
                if self._stalled.is_set():  # set before what woke select was sent: hold it
                    continue
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    other[sock].sendall(data)
        except (OSError, ValueError):  # closed by resume() or close()
            return
        finally:
            _close(client, upstream)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
