"""The chart's share DeviceClass and its ValidatingAdmissionPolicy (DRA mode), enforced by the real
API server. The class has no selector, so that the scheduler evaluates no CEL on every device for
every share (docs/dra.md, "Scheduling cost"); a request of it that asks neither the shared-memory
capacity nor a GPU's tag (a whole GPU) would select any device of any driver, so such a claim or
template is refused with the policy's message, whichever way it names the class (a plain request
or an alternative of a prioritized list). Every claim the webhook writes passes.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import pytest

from gpuslice import config as config_
from gpuslice.sim import controlplane
from gpuslice.webhook import dra_claims

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

SETTINGS = config_.load(overrides={"dra.enabled": True}, environ={})
CONTRACT = SETTINGS.contract
RELEASE = "gs-shares"
POLICY = f"{RELEASE}-gpuslice-share-requests"


@pytest.fixture
def resource_api(
    cluster: controlplane.ControlPlane, workdir: pathlib.Path, admin: kubernetes.client.ApiClient, namespace: str
) -> Iterator[kubernetes.client.ResourceV1Api]:
    """The chart in DRA mode in its own namespace, its share policy in force."""
    k8skit.install_chart(cluster.admin_kubeconfig, RELEASE, RELEASE, {"mode": "dra"}, workdir)
    api = kubernetes.client.ResourceV1Api(admin)

    def in_force() -> bool | None:
        # The API server loads a new policy and its binding a moment after they are created.
        try:
            api.create_namespaced_resource_claim(namespace, _claim("probe", _request(capacity=False)))
        except kubernetes.client.ApiException as exc:
            return exc.status == 422 or None
        api.delete_namespaced_resource_claim("probe", namespace)
        return None

    try:
        k8skit.wait_for("the share policy to be in force", in_force, timeout=60, interval=0.5)
        yield api
    finally:
        k8skit.helm(cluster.admin_kubeconfig, "uninstall", RELEASE, "--namespace", RELEASE, check=False)


def _request(*, capacity: bool, device_class: str = CONTRACT.dra_share_device_class) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if capacity:
        exactly["capacity"] = {"requests": {CONTRACT.dra_capacity_memory: "2Gi"}}
    return exactly


def _claim(name: str, exactly: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _refusal(create: Any, *args: Any) -> str:
    """The policy's message when `create(*args)` is refused by it (not by the API's validation)."""
    with pytest.raises(kubernetes.client.ApiException) as refused:
        create(*args)
    message = k8skit.api_error_message(refused.value)
    assert refused.value.status == 422 and POLICY in message, refused.value.body
    return message


def test_a_share_without_the_shared_memory_capacity_is_refused_naming_it(resource_api, namespace):
    message = _refusal(
        resource_api.create_namespaced_resource_claim, namespace, _claim("bare", _request(capacity=False))
    )
    assert CONTRACT.dra_share_device_class in message and CONTRACT.dra_capacity_memory in message, message
    other = _request(capacity=False)
    other["capacity"] = {"requests": {"memory": "2Gi"}}  # another capacity: still any driver's device
    _refusal(resource_api.create_namespaced_resource_claim, namespace, _claim("other", other))
    resource_api.create_namespaced_resource_claim(namespace, _claim("share", _request(capacity=True)))
    whole = _request(capacity=False, device_class=CONTRACT.dra_device_class)  # the whole-GPU class selects
    resource_api.create_namespaced_resource_claim(namespace, _claim("whole", whole))
    tagged = _request(capacity=False)  # a whole GPU of the share class: a tag of the driver's, no memory
    tagged["capacity"] = {"requests": {CONTRACT.dra_tag_memory(81559): "1"}}
    resource_api.create_namespaced_resource_claim(namespace, _claim("tagged", tagged))


def test_a_prioritized_list_and_a_template_are_checked_too(resource_api, namespace):
    alternatives = [
        {"name": "mig", **_request(capacity=False, device_class=CONTRACT.dra_mig_device_class)},
        {"name": "share", **_request(capacity=False)},
    ]
    claim = _claim("either", {})
    claim["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": alternatives}]
    _refusal(resource_api.create_namespaced_resource_claim, namespace, claim)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bare"},
        "spec": {"spec": _claim("x", _request(capacity=False))["spec"]},
    }
    _refusal(resource_api.create_namespaced_resource_claim_template, namespace, template)


@pytest.mark.parametrize(
    "need",
    [
        dra_claims.ContainerNeed("containers", 0, memory_mib=2048),
        dra_claims.ContainerNeed("containers", 0, memory_mib=2048, devices=2),
        dra_claims.ContainerNeed("containers", 0, gpus=1, mig_profile="1g.10gb", or_memory_mib=9728),
        dra_claims.ContainerNeed("containers", 0, gpus=2),
        dra_claims.ContainerNeed("containers", 0, memory_mib=40704, classes=((81559, 40704), (143771, 71680))),
    ],
    ids=["share", "share-on-two-gpus", "mig-or-share", "whole-gpus", "fraction-of-any-class"],
)
def test_every_template_the_webhook_writes_passes(resource_api, namespace, need):
    kind = "whole-gpus" if need.gpus and not need.mig_profile else "gpu-memory"
    built = dra_claims.build(k8skit.pod_object("x"), dra_claims.Need(kind=kind, containers=(need,)), SETTINGS)
    resource_api.create_namespaced_resource_claim_template(namespace, built.template)
    policy = kubernetes.client.AdmissionregistrationV1Api(resource_api.api_client).read_validating_admission_policy(
        POLICY
    )
    assert not (policy.status and policy.status.type_checking and policy.status.type_checking.expression_warnings)
