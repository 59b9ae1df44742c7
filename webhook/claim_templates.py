"""DRA mode: make sure the ResourceClaimTemplate a converted pod references exists in its namespace,
before the webhook answers (docs/dra.md, "Where the claim templates come from").

Templates are named by their content (webhook/dra_claims.py), so creating one that exists is
success (HTTP 409), and a template once seen is remembered: after the first pod of a size in a
namespace, admissions of that size make no API call. The webhook entry that may create them
declares sideEffects NoneOnDryRun, and nothing is created for a dry-run request. When the
template cannot be created the pod is denied with the reason (no pod is admitted that would
wait for a template that does not exist).

May import the kubernetes client (in a thread: it blocks; gpuslice.kubeclient when none is given).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Protocol

from gpuslice import kubeclient

__all__ = ["ClaimTemplates", "KubernetesTemplateApi", "TemplateApi", "TemplateError", "denial"]


class TemplateError(RuntimeError):
    """The template could not be created; the message names it and says why."""


class TemplateApi(Protocol):
    async def create(self, namespace: str, template: Mapping[str, Any]) -> bool:
        """Create the template; False when one of that name exists already; TemplateError."""


class KubernetesTemplateApi:
    """TemplateApi with the official client: in-cluster config, else the kubeconfig."""

    def __init__(self, api_client: Any = None, *, timeout_seconds: float = 4.0) -> None:
        self._api_client = api_client
        self._timeout = timeout_seconds
        self._resource: Any = None

    async def create(self, namespace: str, template: Mapping[str, Any]) -> bool:
        return await asyncio.to_thread(self._create, namespace, template)

    def _create(self, namespace: str, template: Mapping[str, Any]) -> bool:
        import kubernetes  # only the production path needs it loaded

        name = template["metadata"]["name"]
        try:
            if self._resource is None:
                if self._api_client is None:
                    self._api_client = kubeclient.default_api_client()
                self._resource = kubernetes.client.ResourceV1Api(self._api_client)
            self._resource.create_namespaced_resource_claim_template(
                namespace, dict(template), _request_timeout=self._timeout, _preload_content=False
            )
            return True
        except Exception as exc:  # every failure is the same to the caller: the pod is denied
            status = getattr(exc, "status", None)
            if status == 409:
                return False
            if status is not None:
                try:
                    message = json.loads(getattr(exc, "body", "") or "{}").get("message", "")
                except ValueError:
                    message = ""
                raise TemplateError(
                    f"creating ResourceClaimTemplate {namespace}/{name}: HTTP {status} {message}"
                ) from None
            raise TemplateError(
                f"creating ResourceClaimTemplate {namespace}/{name}: {type(exc).__name__}: {exc}"
            ) from None


class ClaimTemplates:
    """Creates templates once per (namespace, name) and remembers the ones that exist."""

    def __init__(self, api: TemplateApi | None = None, *, remember: int = 10_000) -> None:
        self.api: TemplateApi = api if api is not None else KubernetesTemplateApi()
        self._known: dict[tuple[str, str], None] = {}  # insertion-ordered: the oldest go first
        self._remember = remember
        self._lock = asyncio.Lock()

    async def ensure(self, namespace: str, template: Mapping[str, Any]) -> None:
        """The template exists in `namespace` when this returns; TemplateError otherwise."""
        if not namespace:
            raise TemplateError("the pod has no namespace to create its ResourceClaimTemplate in")
        key = (namespace, str(template["metadata"]["name"]))
        if key in self._known:
            return
        async with self._lock:
            if key in self._known:
                return
            body = {**template, "metadata": {**template["metadata"], "namespace": namespace}}
            await self.api.create(namespace, body)
            self._known[key] = None
            if len(self._known) > self._remember:
                del self._known[next(iter(self._known))]


def denial(response: Mapping[str, Any], message: str) -> dict[str, Any]:
    """The AdmissionReview `response` turned into a denial with `message` (same uid)."""
    uid = response["response"]["uid"]
    status = {"code": 503, "reason": "ServiceUnavailable", "message": f"gpuslice DRA mode: {message}; retry"}
    return {**response, "response": {"uid": uid, "allowed": False, "status": status}}
