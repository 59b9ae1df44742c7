"""AdmissionReviews of a pod CREATE, shaped as kube-apiserver sends them, for the webhook's tests."""

from __future__ import annotations

from typing import Any


def pod_create(
    pod: dict[str, Any], *, uid: str, namespace: str = "team-a", dry_run: bool = False, **request: Any
) -> dict[str, Any]:
    """The review of creating `pod` (request fields in `request` are added or replace the usual ones;
    the uid comes first, as in kube-apiserver's encoding)."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "object": pod,
            "dryRun": dry_run,
            **request,
        },
    }
