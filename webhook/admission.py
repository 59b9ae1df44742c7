"""AdmissionReview admission.k8s.io/v1 in, AdmissionReview out: decoding, the cases the
mutation never sees (other resources, other operations, ignored namespaces), and encoding the
patch as kube-apiserver expects it (patchType JSONPatch, base64). Pure: no I/O.

A review that cannot be answered (not JSON, wrong apiVersion or kind, no request, no uid, a
field of the wrong type) raises `MalformedReview`; the server maps it to HTTP 400. The response always carries the
uid of the request it answers.

May import gpuslice.config and the webhook's pure modules.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from gpuslice import config
from gpuslice.webhook import cluster as cluster_
from gpuslice.webhook import conversions, decoding, mutation, shape

__all__ = ["MalformedReview", "Result", "promise", "review", "review_document"]

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

RESULT_UNCHANGED = "unchanged"
RESULT_MUTATED = "mutated"
RESULT_DENIED = "denied"
RESULT_IGNORED = "ignored"


class MalformedReview(ValueError):
    """The request body is not an AdmissionReview v1 with a request this webhook can answer."""


@dataclasses.dataclass(frozen=True)
class Result:
    response: dict[str, Any]  # the AdmissionReview to send back
    result: str  # one of the RESULT_* values, for metrics
    outcome: mutation.Outcome | None  # None when the pod was not looked at
    dry_run: bool


def _decode(body: bytes | str | Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    """(the document, whether its pod's types are checked already)."""
    if isinstance(body, Mapping):
        return body, False
    if isinstance(body, bytes):
        # Decoding the 5-20 KB pod is the largest cost of an admission (docs/benchmarks.md): only
        # the fields read, in one typed pass; anything unusual is decoded whole below.
        decoded = decoding.fields(body)
        if decoded is not None:
            return decoded.document()
    try:
        document = orjson.loads(body)
    except (orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedReview(f"request body is not JSON: {exc}") from None
    if not isinstance(document, Mapping):
        raise MalformedReview(f"request body must be a JSON object, not {type(document).__name__}")
    return document, False


def _answer(uid: str, allowed: bool, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": uid, "allowed": allowed, **fields}}


_REQUEST_FIELDS = {"resource": Mapping, "subResource": str, "namespace": str, "operation": str, "dryRun": bool}


def _check_request(request: Mapping[str, Any]) -> None:
    """The request fields this webhook reads have their API types (null counts as absent)."""
    for name, kind in _REQUEST_FIELDS.items():
        value = request.get(name)
        if value is not None and not isinstance(value, kind):
            raise MalformedReview(f"AdmissionReview request.{name} has the wrong type ({type(value).__name__})")
    for name in ("group", "resource"):
        value = request["resource"].get(name) if request.get("resource") else None
        if value is not None and not isinstance(value, str):
            raise MalformedReview(f"AdmissionReview request.resource.{name} must be a string")


def review(body: bytes | str | Mapping[str, Any], *, settings: config.Config, cluster: cluster_.ClusterView) -> Result:
    """Answer one AdmissionReview. Raises MalformedReview when there is nothing to answer."""
    document, shaped = _decode(body)
    return review_document(document, shaped, settings=settings, cluster=cluster)


def review_document(
    document: Mapping[str, Any], shaped: bool, *, settings: config.Config, cluster: cluster_.ClusterView
) -> Result:
    """`review` of a decoded AdmissionReview; `shaped`: its pod's types are checked already
    (decoding.fields)."""
    if document.get("kind") != KIND or document.get("apiVersion") != API_VERSION:
        raise MalformedReview(
            f"expected kind {KIND} apiVersion {API_VERSION}, got kind {document.get('kind')!r} "
            f"apiVersion {document.get('apiVersion')!r}"
        )
    request = document.get("request")
    if not isinstance(request, Mapping):
        raise MalformedReview("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("AdmissionReview request has no uid")
    _check_request(request)
    dry_run = bool(request.get("dryRun"))

    resource = request.get("resource") or {}
    is_pod = resource.get("resource") == "pods" and not request.get("subResource") and resource.get("group", "") == ""
    namespace = request.get("namespace") or ""
    if not is_pod or request.get("operation") != "CREATE" or namespace in settings.ignored_namespaces:
        # Pod resources are immutable after creation: only CREATE is ever converted.
        return Result(_answer(uid, True), RESULT_IGNORED, None, dry_run)

    pod = request.get("object")
    if not isinstance(pod, Mapping):
        raise MalformedReview("AdmissionReview request for a pod CREATE has no object")
    try:
        if not shaped:
            shape.check_pod(pod)
    except shape.WrongShape as exc:
        raise MalformedReview(f"AdmissionReview request.{exc}") from None
    outcome = mutation.mutate(pod, settings=settings, cluster=cluster)
    if not outcome.allowed:
        status = {"code": 400, "reason": "BadRequest", "message": outcome.message}
        return Result(_answer(uid, False, status=status), RESULT_DENIED, outcome, dry_run)
    fields: dict[str, Any] = {}
    if outcome.warnings:
        fields["warnings"] = list(outcome.warnings)
    if not outcome.patch:
        return Result(_answer(uid, True, **fields), RESULT_UNCHANGED, outcome, dry_run)
    patch = base64.b64encode(orjson.dumps(outcome.patch)).decode()
    result = Result(_answer(uid, True, patchType="JSONPatch", patch=patch, **fields), RESULT_MUTATED, outcome, dry_run)
    promise(result, cluster)
    return result


def promise(result: Result, cluster: cluster_.ClusterView, *, pod_cpu_milli: int | None = None) -> None:
    """A pod converted (not a dry run) and pinned to one class takes its units there before any
    label shows it: the next pods of a burst choose their class knowing it (webhook/promises.py).
    Every pod mutated counts its CPU (`pod_cpu_milli`, else the outcome's) in the CPU demand."""
    outcome = result.outcome
    if result.result == RESULT_MUTATED and not result.dry_run and outcome is not None and outcome.kind:
        # (a pod whose only change is its scheduler's name has no kind: nothing converted or steered)
        cluster.ledger.promise_conversion(outcome.decision, outcome.cpu_milli)
        owner = cluster.inputs.owner
        if owner:  # its class, for the next pods of its controller (classchoice)
            cluster.note_owner_class(owner, outcome.decision)
        cpu = outcome.pod_cpu_milli if pod_cpu_milli is None else pod_cpu_milli
        cluster.cpu_demand.note(cpu, device=outcome.kind != conversions.KIND_CPU_POD)
