"""Keeps the webhook's ClusterView current from the Kubernetes API: list the nodes, then watch
them from the list's resourceVersion; on 410 Gone relist, on any other error back off and relist.
Admissions read the view in memory; nothing is fetched per request.

The official `kubernetes` client does the calls (auth, kubeconfig, in-cluster config), in a
thread via asyncio.to_thread because it blocks. Responses are read raw (`_preload_content=False`)
and parsed as JSON: turning thousands of nodes into client model objects only to read their
labels would cost far more than the labels themselves. Events are applied to the view on the
event loop, so the view is only ever touched from one thread.

May import gpuslice.contract (through cluster) and the kubernetes client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import threading
from collections.abc import Mapping
from typing import Any

import kubernetes

from gpuslice.webhook import cluster as cluster_

__all__ = ["NodeWatcher", "api_from_environment"]

log = logging.getLogger(__name__)

_LIST_PAGE = 500


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


def api_from_environment(kubeconfig: str | None = None) -> kubernetes.client.CoreV1Api | None:
    """A CoreV1Api from --kubeconfig, the in-cluster service account, $KUBECONFIG or ~/.kube/config;
    None when there is no cluster to talk to (the webhook then uses defaultGpuMemoryMiB)."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    elif os.environ.get("KUBECONFIG") or (pathlib.Path.home() / ".kube" / "config").exists():
        kubernetes.config.load_kube_config(client_configuration=configuration)
    else:
        return None
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))


def _labels(node: Mapping[str, Any]) -> tuple[str, Mapping[str, str], Mapping[str, Any] | None]:
    """(name, labels, status) of a node object; status None when the object has none."""
    metadata = node.get("metadata") or {}
    status = node.get("status")
    return str(metadata.get("name", "")), metadata.get("labels") or {}, status if isinstance(status, Mapping) else None


class NodeWatcher:
    """List + watch nodes into a ClusterView. `run()` until `stop()`; `synced` is set after the first list."""

    def __init__(
        self,
        api: kubernetes.client.CoreV1Api,
        cluster: cluster_.ClusterView,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 30.0,
        backoff_initial_seconds: float = 0.5,
        backoff_max_seconds: float = 30.0,
    ) -> None:
        self.api = api
        self.cluster = cluster
        self.watch_timeout_seconds = watch_timeout_seconds
        self.request_timeout_seconds = request_timeout_seconds
        self.backoff_initial_seconds = backoff_initial_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.synced = asyncio.Event()
        self.lists = 0  # how many full lists were applied (relists after 410 count too)
        self._stopping = threading.Event()
        self._response: Any = None  # the open watch stream, shut down by stop()
        self._wakeup = asyncio.Event()

    def stop(self) -> None:
        """Ask `run()` to return: interrupts a blocking watch read."""
        self._stopping.set()
        self._wakeup.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # best effort: the read ends by its timeout otherwise
                log.debug("could not shut down the watch stream", exc_info=True)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = self.backoff_initial_seconds
        while not self._stopping.is_set():
            try:
                version = await self._relist()
                backoff = self.backoff_initial_seconds
                while not self._stopping.is_set():
                    version = await asyncio.to_thread(self._watch, loop, version)
            except _Gone:
                log.info("node watch expired (410 Gone): relisting")
                continue
            except Exception as exc:  # noqa: BLE001 - any API failure: keep the last view, retry later
                if self._stopping.is_set():
                    break
                log.warning("node list/watch failed, retrying in %.1f s: %s", backoff, exc)
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), backoff)
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, self.backoff_max_seconds)

    # --- list --------------------------------------------------------------------------------
    async def _relist(self) -> str:
        nodes, version = await asyncio.to_thread(self._list)
        seen = set()
        for node in nodes:
            name, labels, status = _labels(node)
            seen.add(name)
            self._update(name, labels, status)
        for name in self.cluster.node_names() - seen:
            self.cluster.remove_node(name)
        self.lists += 1
        self.synced.set()
        return version

    def _list(self) -> tuple[list[Mapping[str, Any]], str]:
        nodes: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": _LIST_PAGE}
            if token:
                kwargs["_continue"] = token
            try:
                response: Any = self.api.list_node(
                    _preload_content=False, _request_timeout=self.request_timeout_seconds, **kwargs
                )
            except kubernetes.client.ApiException as exc:
                if exc.status == 410:
                    raise _Gone() from None  # continue token expired
                raise
            body = json.loads(response.data)
            nodes.extend(body.get("items") or ())
            metadata = body.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return nodes, str(metadata.get("resourceVersion", ""))

    # --- watch -------------------------------------------------------------------------------
    def _watch(self, loop: asyncio.AbstractEventLoop, version: str) -> str:
        """Stream events from `version` until the server ends the watch; returns the last version."""
        try:
            response: Any = self.api.list_node(
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
        try:
            if self._stopping.is_set():
                return version
            for line in response:
                if self._stopping.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
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

    def _apply(self, kind: str, node: Mapping[str, Any]) -> None:
        name, labels, status = _labels(node)
        if kind == "DELETED":
            self.cluster.remove_node(name)
        else:
            self._update(name, labels, status)

    def _update(self, name: str, labels: Mapping[str, str], status: Mapping[str, Any] | None) -> None:
        """Update the view; say once when a node starts or stops being left out."""
        before = self.cluster.untrusted.get(name)
        self.cluster.update_node(name, labels, status=status)
        after = self.cluster.untrusted.get(name)
        if after != before:
            if after is not None:
                log.warning("node %s left out of GPU class choice (%s): %s", name, after[0], after[1])
            else:
                log.info("node %s is used for GPU class choice again", name)
