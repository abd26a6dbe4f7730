"""Limits that keep `serve` answering whatever its clients do: a connection cap and deadlines.

A client that opens many connections, or sends its request one byte at a time (slow loris),
or never reads the answer, must not pin the viewer's threads. ``ConnectionGuard`` counts open
connections (past ``max_connections`` a new one gets a short 503 and is closed) and gives each
one a deadline; one watchdog thread shuts down the socket of any connection past it, which
ends whatever read or write its handler thread is blocked in.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

# Enough for a team refreshing a page; a flood beyond it is answered 503 at once.
MAX_CONNECTIONS = 64
# Time a client has to send its request line and headers (a browser needs milliseconds).
REQUEST_SECONDS = 10.0
# Time to send the answer once it is ready (a page of thousands of rows is a few MB).
ANSWER_SECONDS = 20.0

_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 38\r\nRetry-After: 5\r\nConnection: close\r\n\r\n"
    b"too many connections; try again soon\r\n"
)


class ConnectionGuard:
    """Open connections, each with a deadline; a watchdog closes the ones past theirs."""

    def __init__(
        self,
        max_connections: int = MAX_CONNECTIONS,
        *,
        request_seconds: float = REQUEST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        tick: float = 0.25,
    ) -> None:
        self.max_connections = max_connections
        self.request_seconds = request_seconds
        self._clock = clock
        self._tick = tick
        self._lock = threading.Lock()
        self._deadlines: dict[socket.socket, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="serve-watchdog", daemon=True)
        self.refused = 0
        self.cut = 0

    def start(self) -> None:
        """Start the watchdog thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    @property
    def open(self) -> int:
        """How many connections are being handled now."""
        with self._lock:
            return len(self._deadlines)

    def admit(self, sock: socket.socket) -> bool:
        """Take a new connection (deadline: its request); False, after a 503, when full."""
        with self._lock:
            if len(self._deadlines) < self.max_connections:
                self._deadlines[sock] = self._clock() + self.request_seconds
                return True
            self.refused += 1
        with contextlib.suppress(OSError):
            sock.setblocking(False)  # a client that reads nothing must not block the loop
            sock.send(_BUSY)
        return False

    def extend(self, sock: socket.socket, seconds: float) -> None:
        """Give a connection whose request has arrived ``seconds`` more to be answered."""
        with self._lock:
            if sock in self._deadlines:
                self._deadlines[sock] = self._clock() + seconds

    def release(self, sock: socket.socket) -> None:
        """Forget a connection that is finished."""
        with self._lock:
            self._deadlines.pop(sock, None)

    def _watch(self) -> None:
        while not self._stop.wait(self._tick):
            now = self._clock()
            with self._lock:
                late = [s for s, deadline in self._deadlines.items() if deadline <= now]
            for sock in late:
                self.cut += 1
                # Wakes the handler thread from its blocked read or write; the server closes
                # the socket when the handler returns.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                self.release(sock)
