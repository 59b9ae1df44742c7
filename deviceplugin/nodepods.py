"""The pods bound to one node, kept current by a list + watch that asks only for them (field
selector `spec.nodeName=<node>`), for the labeller's CPU and memory headroom.

Listing the node's pods on every refresh (every poll and every Allocate) cost the API server a
list per node every few seconds; a watch costs one list at start (from the watch cache,
resourceVersion "0") and then only the node's own pod events. On 410 Gone the pods are listed
again; on any other error the last view is kept and the list is retried with backoff.

The official client blocks, so its calls run in a thread; responses are read raw and parsed as
JSON, and events are applied on the event loop, so the view is only touched from one thread.
`stop()` shuts the open watch stream so a blocking read ends at once.

May import the kubernetes client; nothing of gpuslice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes

__all__ = ["NodePods"]

log = logging.getLogger(__name__)


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class NodePods:
    """`run()` until cancelled or `stop()`; `pods()` once `synced` is set."""

    def __init__(
        self,
        core_api: Callable[[], Any],
        node_name: str,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 10.0,
        backoff_initial_seconds: float = 0.5,
        backoff_max_seconds: float = 30.0,
    ) -> None:
        self._core_api = core_api  # () -> kubernetes.client.CoreV1Api, made on first use
        self.field_selector = f"spec.nodeName={node_name}"
        self.watch_timeout_seconds = watch_timeout_seconds
        self.request_timeout_seconds = request_timeout_seconds
        self.backoff_initial_seconds = backoff_initial_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.synced = asyncio.Event()
        self.lists = 0
        self.watches = 0
        self.failures = 0  # lists or watches that failed (not counting 410 Gone)
        self._pods: dict[str, Mapping[str, Any]] = {}  # by UID
        self._stopping = threading.Event()
        self._response: Any = None

    def pods(self) -> list[Mapping[str, Any]]:
        return list(self._pods.values())

    @property
    def listing(self) -> bool:
        """The first list is still on its way (no list done, none failed)."""
        return not self.synced.is_set() and not self.failures and not self._stopping.is_set()

    def stop(self) -> None:
        """Ask `run()` to return and interrupt a blocking watch read."""
        self._stopping.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the read ends by its timeout otherwise
                log.debug("could not shut down the pod watch", exc_info=True)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = self.backoff_initial_seconds
        try:
            while not self._stopping.is_set():
                try:
                    version = await self._relist()
                    backoff = self.backoff_initial_seconds
                    while not self._stopping.is_set():
                        started = loop.time()
                        version = await asyncio.to_thread(self._watch, loop, version)
                        if loop.time() - started < 1.0:  # a server that ends watches at once is not hammered
                            await asyncio.sleep(self.backoff_initial_seconds)
                except _Gone:
                    log.info("pod watch of %s expired (410 Gone): listing again", self.field_selector)
                except Exception as exc:  # noqa: BLE001 - any API failure: keep the last view, retry
                    if self._stopping.is_set():
                        break
                    self.failures += 1
                    log.warning("pods of %s not watched, retrying in %.1f s: %s", self.field_selector, backoff, exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.backoff_max_seconds)
        finally:
            self.stop()  # a cancelled run must not leave a thread reading the stream

    async def _relist(self) -> str:
        items, version = await asyncio.to_thread(self._list)
        self._pods = {_uid(pod): pod for pod in items}
        self.lists += 1
        self.synced.set()
        return version

    def _list(self) -> tuple[list[Mapping[str, Any]], str]:
        try:
            response: Any = self._core_api().list_pod_for_all_namespaces(
                field_selector=self.field_selector,
                resource_version="0",  # the API server's watch cache, not etcd
                _preload_content=False,
                _request_timeout=self.request_timeout_seconds,
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 410:
                raise _Gone() from None
            raise
        body = json.loads(response.data)
        return list(body.get("items") or ()), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def _watch(self, loop: asyncio.AbstractEventLoop, version: str) -> str:
        """Stream the node's pod events from `version` until the server ends the watch."""
        try:
            response: Any = self._core_api().list_pod_for_all_namespaces(
                field_selector=self.field_selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_seconds,
                _preload_content=False,
                _request_timeout=(self.request_timeout_seconds, self.watch_timeout_seconds + 30),
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 410:
                raise _Gone() from None
            raise
        self._response = response
        self.watches += 1
        try:
            for line in response:
                if self._stopping.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    loop.call_soon_threadsafe(self._apply, kind, obj)
            return version
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self._pods.pop(_uid(pod), None)
        else:
            self._pods[_uid(pod)] = pod


def _uid(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")
