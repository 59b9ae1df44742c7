"""DRA mode: the ResourceClaimTemplate a converted pod references is created once per namespace and
then remembered, one someone else created counts as created, and a failed creation denies the pod
with the reason (webhook/claim_templates.py). Through the HTTP server: tests/webhook/test_dra_claims.py."""

from __future__ import annotations

import asyncio

import pytest
from test_dra_claims import SETTINGS, FakeTemplateApi, pod, share

from gpuslice.webhook import claim_templates, dra_claims


async def test_a_template_is_created_once_per_namespace_and_then_remembered():
    api = FakeTemplateApi()
    templates = claim_templates.ClaimTemplates(api)
    template = dra_claims.build(pod(), share(2048), SETTINGS).template
    await asyncio.gather(*(templates.ensure("team-a", template) for _ in range(5)))
    await templates.ensure("team-b", template)
    assert api.calls == 2 and set(api.created) == {
        ("team-a", template["metadata"]["name"]),
        ("team-b", template["metadata"]["name"]),
    }
    assert api.created[("team-b", template["metadata"]["name"])]["metadata"]["namespace"] == "team-b"


async def test_a_template_someone_else_created_counts_as_created():
    api = FakeTemplateApi()
    template = dra_claims.build(pod(), share(2048), SETTINGS).template
    await api.create("team-a", template)
    await claim_templates.ClaimTemplates(api).ensure("team-a", template)
    assert api.calls == 2


async def test_a_failed_creation_denies_the_pod_with_the_reason():
    templates = claim_templates.ClaimTemplates(FakeTemplateApi(fail="HTTP 403 forbidden"))
    template = dra_claims.build(pod(), share(2048), SETTINGS).template
    with pytest.raises(claim_templates.TemplateError, match="403"):
        await templates.ensure("team-a", template)
    response = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u1", "allowed": True, "patch": "x"},
    }
    denied = claim_templates.denial(response, "HTTP 403 forbidden")
    assert denied["response"] == {
        "uid": "u1",
        "allowed": False,
        "status": {
            "code": 503,
            "reason": "ServiceUnavailable",
            "message": "gpuslice DRA mode: HTTP 403 forbidden; retry",
        },
    }
