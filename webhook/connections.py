"""Bounds on the webhook's connections: an aiohttp site that caps how many are open, how long a
TLS handshake and a connection's first request may take and how long a connection may live, keeps
each idle connection small, and gives freed memory back.

Without them, a connection that completes its TLS handshake and then sends nothing is held for
aiohttp's hour-long keep-alive default, and each one costs a quarter of a MiB (asyncio's TLS read
buffer, OpenSSL's state, the protocol and its parser): a thousand idle clients exhaust the pod's
memory limit, or, under a cap, take every place and starve the API server's admissions. The idle
and header wait is aiohttp's keep-alive timeout (set by `server.start`); the body read is bounded
in the handler. Here:

- TLS runs through asyncio's own TLS protocol with a 17 KiB read buffer instead of its 256 KiB
  (one whole TLS record: a bigger one reads nothing in fewer calls) and no session tickets
  (certs.server_context): about 80 KiB per idle connection instead of 290;
- a connection that has not sent a whole request's headers `first_request_timeout_seconds` after
  it was accepted is closed (like Go's ReadHeaderTimeout, apart from the keep-alive idle timeout);
- at most `max_connections` are served at once: one more makes room by closing the connection
  idle the longest (one that never sent a request first), and is answered 503 and closed only
  when every open connection is in the middle of a request; an idle client cannot starve others;
- a TLS handshake must finish within `tls_handshake_timeout_seconds`;
- a connection older than `max_connection_age_seconds` is closed with the answer to its next
  request (`Connection: close`; `retire_if_old`, called by the server's middleware): clients
  reconnect, which also spreads them over replicas added since;
- when many connections have closed, the C heap is trimmed (glibc's malloc_trim) so the resident
  memory they held goes back to the system instead of staying with the process.

May import aiohttp, gpuslice.config and the webhook's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import ssl
from asyncio import sslproto
from typing import Any

from aiohttp import web

from gpuslice import config
from gpuslice.webhook import metrics as metrics_

__all__ = ["Book", "BoundedSite", "retire_if_old", "trim_heap"]

log = logging.getLogger(__name__)

_REFUSAL = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
# Trim the heap once this many connections have closed since the last trim.
_TRIM_AFTER_CLOSED = 64
# asyncio's TLS protocol reads ciphertext into one buffer per connection (256 KiB by default,
# allocated and zeroed whole): one whole TLS record (16 KiB of data and its overhead) is enough.
TLS_READ_BUFFER_BYTES = 17 * 1024
_ANSWER_WRITE_GRACE_SECONDS = 1.0
# Connections the kernel queues before they are accepted (aiohttp's default: 128; the kernel caps
# it at net.core.somaxconn, 4096 on current kernels).
ACCEPT_BACKLOG = 2048


def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Give free C heap pages back to the system; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a failed handshake's exception (asyncio logs it already) so it is not reported again."""
    if not future.cancelled():
        future.exception()


class _SmallBufferTls(sslproto.SSLProtocol):
    """asyncio's server-side TLS (what `loop.create_server(ssl=...)` makes) with a smaller read buffer."""

    max_size = TLS_READ_BUFFER_BYTES


class _Refuse(asyncio.Protocol):
    """One connection too many: a 503 and close, without reading the request."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_REFUSAL)
        transport.close()


class Book:
    """What the site knows of each open connection, by the id of its request handler: when it was
    accepted, whether a request is in progress on it, and when its last request ended."""

    def __init__(self) -> None:
        self.born: dict[int, float] = {}
        self.last_done: dict[int, float] = {}
        self.busy: set[int] = set()
        self.closing: set[int] = set()  # closed by the site, until the handler is gone

    def accepted(self, handler: object, now: float) -> None:
        key = id(handler)  # may be a closed handler's id, reused: nothing of that one is kept
        self.forget(key)
        self.born[key] = now

    def begin(self, handler: object) -> None:
        self.busy.add(id(handler))

    def end(self, handler: object, now: float) -> None:
        self.busy.discard(id(handler))
        self.last_done[id(handler)] = now

    def age(self, handler: object, now: float) -> float:
        return now - self.born.get(id(handler), now)

    def sent_a_request(self, key: int) -> bool:
        return key in self.last_done or key in self.busy

    def eviction_order(self, key: int) -> tuple[bool, float]:
        """Sorts first the connection to close for a new one: never used, then idle the longest."""
        return self.sent_a_request(key), self.last_done.get(key, self.born.get(key, 0.0))

    def forget(self, key: int) -> None:
        self.born.pop(key, None)
        self.last_done.pop(key, None)
        self.busy.discard(key)
        self.closing.discard(key)


def retire_if_old(request: web.Request, response: web.StreamResponse, book: Book, max_age: float) -> None:
    """Close the connection with this answer when it has lived longer than `max_age` seconds."""
    if book.age(request.protocol, asyncio.get_running_loop().time()) > max_age and not response.prepared:
        response.force_close()


class BoundedSite(web.BaseSite):
    """An HTTPS site like aiohttp's TCPSite, with the bounds above (`settings.webhook`)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext,
        settings: config.WebhookConfig,
        metrics: metrics_.Metrics,
        book: Book,
    ) -> None:
        # A burst of connections (a thousand clients at once) must not overflow the accept queue:
        # a dropped SYN is retried only after a second, and the API server's admission waits with it.
        super().__init__(runner, ssl_context=ssl_context, backlog=ACCEPT_BACKLOG)
        self._host, self._port = host, port
        self._settings = settings
        self._metrics = metrics
        self._book = book
        self._sweeper: asyncio.Task[None] | None = None
        self._closed_since_trim = 0

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    @property
    def book(self) -> Book:
        return self._book

    def open_connections(self) -> int:
        server = self._runner.server
        return len(server.connections) if isinstance(server, web.Server) else 0

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        # TLS is layered in `_accept` (a smaller read buffer), so the server itself is plain TCP.
        self._server = await loop.create_server(
            self._accept, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        self._sweeper = asyncio.create_task(self._sweep(), name="gpuslice-webhook-connection-sweep")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await super().stop()

    def _accept(self) -> asyncio.BaseProtocol:
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert isinstance(server, web.Server)
        app_protocol: asyncio.BaseProtocol
        if len(server.connections) >= self._settings.max_connections and not self._make_room(server):
            self._metrics.connections_refused.inc()
            self._metrics.http_error("other", 503).inc()
            app_protocol = _Refuse()
        else:
            handler = server()
            now = loop.time()
            self._book.accepted(handler, now)
            # A timer per connection, not the sweep: closes keep the spread of their accepts, so a
            # client that reconnects at once does not come back as one synchronised burst.
            loop.call_at(now + self._settings.first_request_timeout_seconds, self._first_request_due, handler)
            app_protocol = handler
        assert self._ssl_context is not None
        handshake = loop.create_future()  # what asyncio's own server awaits; nobody needs it here
        handshake.add_done_callback(_consume)
        return _SmallBufferTls(
            loop,
            app_protocol,
            self._ssl_context,
            handshake,
            server_side=True,
            # typeshed says int; asyncio takes any number of seconds
            ssl_handshake_timeout=self._settings.tls_handshake_timeout_seconds,  # type: ignore[arg-type]
        )

    def _make_room(self, server: web.Server) -> bool:
        """Close the connection idle the longest (never used first); False when all are mid-request."""
        book = self._book
        # An answer may still be being written just after its handler returned: spare those.
        recent = asyncio.get_running_loop().time() - _ANSWER_WRITE_GRACE_SECONDS
        idle = [
            h
            for h in server.connections
            if id(h) not in book.busy and id(h) not in book.closing and book.last_done.get(id(h), 0.0) < recent
        ]
        if not idle:
            return False
        self._close(min(idle, key=lambda h: book.eviction_order(id(h))), "evicted")
        return True

    def _first_request_due(self, handler: web.RequestHandler) -> None:
        key = id(handler)
        if handler.transport is not None and not self._book.sent_a_request(key) and key not in self._book.closing:
            self._close(handler, "no request")

    def _close(self, handler: Any, reason: str) -> None:
        self._book.closing.add(id(handler))
        handler.force_close()
        self._metrics.connections_closed(reason).inc()

    async def _sweep(self) -> None:
        """Forget closed connections, export the open count, and trim the heap once enough have closed."""
        bounds = self._settings
        interval = max(0.05, min(2.5, bounds.idle_timeout_seconds / 4))
        while True:
            await asyncio.sleep(interval)
            server = self._runner.server
            if not isinstance(server, web.Server):
                continue
            now = asyncio.get_running_loop().time()
            live = {id(h) for h in server.connections}
            # A handler joins `server.connections` once its handshake is done: keep those still in one.
            handshaking = now - bounds.tls_handshake_timeout_seconds - interval
            gone = [key for key, born in self._book.born.items() if key not in live and born < handshaking]
            for key in gone:
                self._book.forget(key)
            self._metrics.open_connections.set(len(live))
            self._closed_since_trim += len(gone)
            if self._closed_since_trim >= _TRIM_AFTER_CLOSED:  # at most once a sweep: a few ms
                self._closed_since_trim = 0
                trim_heap()
