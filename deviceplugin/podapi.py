"""The usage monitor's calls to the API server: its node's pods, Events on a pod, evictions.

* `node_pods`: every pod bound to the node (served from the API server's watch cache,
  resourceVersion "0"), reduced to what joins a process's cgroup to a pod: UID, namespace, name
  and container runtime IDs -> container names (regular, init and ephemeral containers).
* `create_event`: a core/v1 Event on the pod (what `kubectl describe pod` and `kubectl get
  events` show), naming the container in `involvedObject.fieldPath`.
* `evict`: the Eviction API (policy/v1), so PodDisruptionBudgets hold: 429 means a budget
  forbids it now. A UID precondition makes sure a pod re-created under the same name is never
  the one evicted.

`KubernetesPodApi` uses the official client (in-cluster configuration, else the kubeconfig) in a
thread, since the client blocks; tests give it an ApiClient pointed at a local fake API server.
May import no other gpuslice module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import json
from collections.abc import Mapping
from typing import Any, Protocol

from gpuslice import kubeclient

__all__ = [
    "EVENT_COMPONENT",
    "EvictionResult",
    "KubernetesPodApi",
    "PodApi",
    "PodApiError",
    "PodEvent",
    "PodInfo",
    "pod_info",
]

EVENT_COMPONENT = "gpuslice-device-plugin"
_MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_MESSAGE_LIMIT = 1024  # the API server refuses longer Event messages


class PodApiError(RuntimeError):
    """A call did not reach the API server or was refused (error status, timeout, no credentials)."""


class EvictionResult(enum.Enum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget does not allow it now
    GONE = "gone"  # 404, or 409 from the UID precondition: the pod we meant no longer exists


@dataclasses.dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    containers: Mapping[str, str]  # container runtime ID (hex, no "containerd://") -> container name
    # A static pod's cgroup carries the UID kubelet hashed from its manifest; the API server's
    # mirror pod has another UID and names the first in this annotation.
    static_uid: str = ""


@dataclasses.dataclass(frozen=True)
class PodEvent:
    namespace: str
    pod: str
    pod_uid: str
    container: str
    reason: str
    message: str
    type: str = "Warning"


class PodApi(Protocol):
    async def node_pods(self, node_name: str) -> list[PodInfo]: ...

    async def create_event(self, event: PodEvent, node_name: str) -> None: ...

    async def evict(self, namespace: str, name: str, uid: str) -> EvictionResult: ...


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """A PodInfo from a Pod object as JSON."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    containers: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(key) or ():
            runtime_id = str(entry.get("containerID") or "").partition("://")[2]
            if runtime_id:
                containers[runtime_id] = str(entry.get("name", ""))
    return PodInfo(
        uid=str(metadata.get("uid", "")),
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        containers=containers,
        static_uid=str((metadata.get("annotations") or {}).get(_MIRROR_ANNOTATION, "")),
    )


class KubernetesPodApi:
    """PodApi with the official client; calls run in a thread because the client blocks."""

    def __init__(self, api_client: Any = None, *, timeout_seconds: float = 10.0) -> None:
        self._core_api = kubeclient.LazyCoreApi(api_client)  # None: the default client, on first use
        self._timeout = timeout_seconds

    async def node_pods(self, node_name: str) -> list[PodInfo]:
        return await asyncio.to_thread(self._node_pods, node_name)

    async def create_event(self, event: PodEvent, node_name: str) -> None:
        await asyncio.to_thread(self._create_event, event, node_name)

    async def evict(self, namespace: str, name: str, uid: str) -> EvictionResult:
        return await asyncio.to_thread(self._evict, namespace, name, uid)

    def close(self) -> None:
        self._core_api.close()

    # --- in the thread ---------------------------------------------------------------------

    def _call(self, what: str, call: Any) -> Any:
        import kubernetes
        import urllib3

        try:
            return call(self._core_api())
        except kubernetes.client.ApiException:
            raise  # the caller decides what a status means
        except kubernetes.config.ConfigException as exc:
            raise PodApiError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError, TypeError) as exc:
            raise PodApiError(f"{what}: {type(exc).__name__}: {exc}") from None

    def _node_pods(self, node_name: str) -> list[PodInfo]:
        import kubernetes

        what = f"GET pods of node {node_name}"
        try:
            response = self._call(
                what,
                lambda core: core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={node_name}",
                    resource_version="0",  # the API server's watch cache, not etcd
                    _request_timeout=self._timeout,
                    _preload_content=False,
                ),
            )
            items = json.loads(response.data).get("items") or ()
        except kubernetes.client.ApiException as exc:
            raise PodApiError(f"{what}: HTTP {exc.status} {exc.reason}") from None
        except (ValueError, AttributeError) as exc:
            raise PodApiError(f"{what}: not a PodList: {exc}") from None
        return [pod_info(item) for item in items if isinstance(item, Mapping)]

    def _create_event(self, event: PodEvent, node_name: str) -> None:
        import kubernetes

        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = event.message if len(event.message) <= _MESSAGE_LIMIT else event.message[: _MESSAGE_LIMIT - 1] + "…"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{event.pod}.", "namespace": event.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": event.namespace,
                "name": event.pod,
                "uid": event.pod_uid,
                **({"fieldPath": f"spec.containers{{{event.container}}}"} if event.container else {}),
            },
            "reason": event.reason,
            "message": message,
            "type": event.type,
            "source": {"component": EVENT_COMPONENT, "host": node_name},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        what = f"POST Event on pod {event.namespace}/{event.pod}"
        try:
            self._call(
                what,
                lambda core: core.create_namespaced_event(
                    event.namespace, body, _request_timeout=self._timeout, _preload_content=False
                ),
            )
        except kubernetes.client.ApiException as exc:
            raise PodApiError(f"{what}: HTTP {exc.status} {exc.reason}") from None

    def _evict(self, namespace: str, name: str, uid: str) -> EvictionResult:
        import kubernetes

        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        what = f"POST eviction of pod {namespace}/{name}"
        try:
            self._call(
                what,
                lambda core: core.create_namespaced_pod_eviction(
                    name, namespace, body, _request_timeout=self._timeout, _preload_content=False
                ),
            )
        except kubernetes.client.ApiException as exc:
            if exc.status == 429:
                return EvictionResult.BLOCKED
            if exc.status in (404, 409):
                return EvictionResult.GONE
            raise PodApiError(f"{what}: HTTP {exc.status} {exc.reason}") from None
        return EvictionResult.EVICTED
