"""The DRA plugin's view of the API server, through the official kubernetes client.

Reads ResourceClaims (NodePrepareResources names claims; their allocation lives in the API) and
the Node (its UID, for the slices' ownerReference); lists, creates, replaces and deletes this
node's ResourceSlices of this driver. Objects travel as plain JSON dicts (`_preload_content=False`
and dict bodies): the plugin builds and compares them as dicts, and no field is lost to a client
model older than the API server. The client is blocking, so every call runs in a thread.

RBAC this needs (charts/gpuslice/templates/dra-plugin.yaml): get resourceclaims; get nodes;
get, list, watch, create, update, delete resourceslices.

May import the kubernetes client (gpuslice.kubeclient when none is given) and gpuslice.dra.preparer (its
error types).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gpuslice import kubeclient
from gpuslice.dra import preparer

__all__ = ["KubernetesApi", "SliceApiError"]


class SliceApiError(RuntimeError):
    """A ResourceSlice call failed (error status, timeout, no credentials)."""


class KubernetesApi:
    """ClaimApi and SliceApi with in-cluster config, else the kubeconfig."""

    def __init__(self, api_client: Any = None, *, timeout_seconds: float = 10.0) -> None:
        self._api_client = api_client
        self._owns_client = api_client is None
        self._timeout = timeout_seconds
        self._resource: Any = None
        self._core: Any = None

    def _apis(self) -> tuple[Any, Any]:
        import kubernetes  # only the production path needs it loaded

        if self._resource is None:
            if self._api_client is None:
                self._api_client = kubeclient.default_api_client()
            self._resource = kubernetes.client.ResourceV1Api(self._api_client)
            self._core = kubernetes.client.CoreV1Api(self._api_client)
        return self._resource, self._core

    def resource_api(self) -> Any:
        """The client's resource.k8s.io API, for the slice watch (dra.slicewatch)."""
        return self._apis()[0]

    def close(self) -> None:
        if self._owns_client and self._api_client is not None:
            self._api_client.close()

    # --- claims ---------------------------------------------------------------------------

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._get_claim, namespace, name)

    def _get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        what = f"GET ResourceClaim {namespace}/{name}"
        try:
            resource, _ = self._apis()
            answer = resource.read_namespaced_resource_claim(
                name, namespace, _request_timeout=self._timeout, _preload_content=False
            )
            return json.loads(answer.data)
        except Exception as exc:  # every failure becomes a claim error kubelet retries
            if getattr(exc, "status", None) == 404:
                raise preparer.ClaimNotFound(f"{what}: not found") from None
            raise preparer.ClaimApiError(f"{what}: {_describe(exc)}") from None

    # --- the node and its slices ------------------------------------------------------------

    async def node_owner(self, node_name: str) -> dict[str, str]:
        """{"name", "uid"} of the Node, for the slices' ownerReference."""
        return await asyncio.to_thread(self._node_owner, node_name)

    def _node_owner(self, node_name: str) -> dict[str, str]:
        try:
            _, core = self._apis()
            answer = core.read_node(node_name, _request_timeout=self._timeout, _preload_content=False)
            return {"name": node_name, "uid": json.loads(answer.data)["metadata"]["uid"]}
        except Exception as exc:
            raise SliceApiError(f"GET node {node_name}: {_describe(exc)}") from None

    async def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._list_slices, node_name, driver)

    def _list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        try:
            resource, _ = self._apis()
            answer = resource.list_resource_slice(
                field_selector=f"spec.nodeName={node_name},spec.driver={driver}",
                _request_timeout=self._timeout,
                _preload_content=False,
            )
            return list(json.loads(answer.data).get("items") or ())
        except Exception as exc:
            raise SliceApiError(f"LIST ResourceSlices of node {node_name}: {_describe(exc)}") from None

    async def create_slice(self, obj: dict[str, Any]) -> None:
        await asyncio.to_thread(self._write, "create", obj)

    async def replace_slice(self, obj: dict[str, Any]) -> None:
        await asyncio.to_thread(self._write, "replace", obj)

    async def delete_slice(self, name: str) -> None:
        await asyncio.to_thread(self._write, "delete", {"metadata": {"name": name}})

    def _write(self, verb: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        try:
            resource, _ = self._apis()
            if verb == "create":
                resource.create_resource_slice(obj, _request_timeout=self._timeout, _preload_content=False)
            elif verb == "replace":
                resource.replace_resource_slice(name, obj, _request_timeout=self._timeout, _preload_content=False)
            else:
                resource.delete_resource_slice(name, _request_timeout=self._timeout, _preload_content=False)
        except Exception as exc:
            if verb == "delete" and getattr(exc, "status", None) == 404:
                return
            raise SliceApiError(f"{verb.upper()} ResourceSlice {name}: {_describe(exc)}") from None


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    if status is not None:
        body = getattr(exc, "body", None) or ""
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = ""
        return f"HTTP {status} {getattr(exc, 'reason', '')}" + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"
