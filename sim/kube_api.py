"""A small asyncio client of the Kubernetes REST API for the replay on the real control plane
(`gpuslice-sim --scheduler kube`): create, patch, list and watch, many requests in flight over one
connection pool. The official client is blocking (one thread per request in flight); ten thousand
pods, their status patches and the nodes' label patches go through this one instead.

May import aiohttp, orjson and the standard library only.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson

__all__ = ["Api", "ApiError", "follow"]

_JSON = "application/json"
_MERGE = "application/merge-patch+json"


class ApiError(RuntimeError):
    """The API server answered with an error status; `status` and its message are kept."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.status = status
        self.message = str(body.get("message", body)) if isinstance(body, dict) else str(body)
        super().__init__(f"{method} {path}: HTTP {status}: {self.message}")


class Api:
    """Bearer-token client of one API server; use as an async context manager."""

    def __init__(self, server: str, token: str, cafile: str, *, connections: int = 64) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._cafile = cafile
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        context = ssl.create_default_context(cafile=self._cafile)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=self._connections),
            headers={"Authorization": f"Bearer {self._token}", "Accept": _JSON},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            read_bufsize=1 << 20,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Api used outside `async with`")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = _JSON,
        timeout: float = 60.0,
    ) -> Any:
        """The decoded answer; an error status raises ApiError."""
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else None
        async with self.session.request(
            method,
            self.server + path,
            data=data,
            params=params,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            raw = await response.read()
            decoded = _decode(raw)
            if response.status >= 400:
                raise ApiError(method, path, response.status, decoded)
            return decoded

    async def create(self, path: str, obj: Mapping[str, Any], *, dry_run: bool = False) -> Any:
        return await self.request("POST", path, obj, params={"dryRun": "All"} if dry_run else None)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        return await self.request("PATCH", path, patch, content_type=_MERGE)

    async def watch(
        self, path: str, resource_version: str, *, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from `resource_version` on, until the server ends the watch. A
        410 Gone (the version is too old) raises ApiError with status 410: list again."""
        query = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true", **(params or {})}
        async with self.session.get(
            self.server + path, params=query, timeout=aiohttp.ClientTimeout(total=None)
        ) as response:
            if response.status >= 400:
                raise ApiError("WATCH", path, response.status, _decode(await response.read()))
            reader = response.content
            while True:
                line = await reader.readline()  # read_bufsize bounds one line: far above any pod
                if not line:
                    return
                event = orjson.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    raise ApiError("WATCH", path, int(obj.get("code") or 500), obj)
                yield str(kind), obj


async def follow(
    api: Api, path: str, handle: Callable[[str, dict[str, Any]], None], *, params: Mapping[str, str] | None = None
) -> None:
    """List `path`, then watch it, calling `handle(event type, object)` for every object (listed ones
    as ADDED), until cancelled; lists again when the watch's version is too old."""
    version = ""
    while True:
        if not version:
            listed = await api.request("GET", path, params=params)
            version = str(listed["metadata"]["resourceVersion"])
            for obj in listed.get("items") or ():
                handle("ADDED", obj)
        try:
            async for kind, obj in api.watch(path, version, params=params):
                version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    handle(kind, obj)
        except ApiError as exc:
            if exc.status != 410:
                raise
            version = ""
        except (aiohttp.ClientError, TimeoutError):
            # The server ended the stream, or a loaded machine dropped or timed out the connection:
            # watch again from the last version (a list again if it is too old by then).
            await asyncio.sleep(0.1)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")
