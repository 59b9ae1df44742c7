"""Bounds on the webhook's connections: an aiohttp site that caps how many are open, how long a
TLS handshake may take and how long a connection may live, and gives freed memory back.

Without them, a connection that completes its TLS handshake and then sends nothing is held for
aiohttp's hour-long keep-alive default, and each one costs tens of KiB (TLS buffers, the protocol
and its parser): a few thousand idle clients, or a slow trickle of them, exhaust the pod's memory
limit. The idle and header wait is aiohttp's keep-alive timeout (set by `server.start`); the body
read is bounded in the handler. Here:

- at most `max_connections` are served at once; one more is answered 503 and closed;
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
from typing import Any

from aiohttp import web

from gpuslice import config
from gpuslice.webhook import metrics as metrics_

__all__ = ["Ages", "BoundedSite", "retire_if_old", "trim_heap"]

log = logging.getLogger(__name__)

_REFUSAL = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
# Trim the heap once this many connections have closed since the last trim.
_TRIM_AFTER_CLOSED = 64


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


class _Refuse(asyncio.Protocol):
    """One connection too many: a 503 and close, without reading the request."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_REFUSAL)
        transport.close()


class Ages:
    """When each open connection was accepted (loop time), by the id of its request handler."""

    def __init__(self) -> None:
        self.born: dict[int, float] = {}

    def age(self, handler: object, now: float) -> float:
        return now - self.born.get(id(handler), now)


def retire_if_old(request: web.Request, response: web.StreamResponse, ages: Ages, max_age: float) -> None:
    """Close the connection with this answer when it has lived longer than `max_age` seconds."""
    if ages.age(request.protocol, asyncio.get_running_loop().time()) > max_age and not response.prepared:
        response.force_close()


class BoundedSite(web.BaseSite):
    """An HTTPS site like aiohttp's TCPSite, with the bounds above (`settings.webhook`)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: Any,
        settings: config.WebhookConfig,
        metrics: metrics_.Metrics,
        ages: Ages,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port = host, port
        self._settings = settings
        self._metrics = metrics
        self._ages = ages
        self._sweeper: asyncio.Task[None] | None = None
        self._closed_since_trim = 0

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    def open_connections(self) -> int:
        server = self._runner.server
        return len(server.connections) if isinstance(server, web.Server) else 0

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accept,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self._settings.tls_handshake_timeout_seconds,
            backlog=self._backlog,
            reuse_address=True,
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
        server = self._runner.server
        assert isinstance(server, web.Server)
        if len(server.connections) >= self._settings.max_connections:
            self._metrics.connections_refused.inc()
            self._metrics.http_error("other", 503).inc()
            return _Refuse()
        handler = server()
        self._ages.born[id(handler)] = asyncio.get_running_loop().time()
        return handler

    async def _sweep(self) -> None:
        """Forget closed connections, export the open count, and trim the heap once enough have closed."""
        interval = max(0.05, min(5.0, self._settings.idle_timeout_seconds / 4))
        while True:
            await asyncio.sleep(interval)
            server = self._runner.server
            if not isinstance(server, web.Server):
                continue
            live = {id(h) for h in server.connections}
            gone = [key for key in self._ages.born if key not in live]
            for key in gone:
                del self._ages.born[key]
            self._metrics.open_connections.set(len(live))
            self._closed_since_trim += len(gone)
            if self._closed_since_trim >= _TRIM_AFTER_CLOSED and len(live) < self._closed_since_trim:
                self._closed_since_trim = 0
                trim_heap()
