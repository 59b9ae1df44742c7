"""The chart's ValidatingAdmissionPolicy on ResourceSlice writes (DRA mode), enforced by the real API
server: a token of the DRA plugin's ServiceAccount bound to a pod on node A (TokenRequest, as
kubelet mounts it) may create, change and delete the gpuslice driver's slices of node A only. A
slice of another node, of another driver, or moved to another node is refused with the policy's
message.
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

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CONTRACT = config_.Config().contract
RELEASE = "gs-slices"


@pytest.fixture
def dra_release(cluster: controlplane.ControlPlane, workdir: pathlib.Path) -> Iterator[str]:
    """The chart in DRA mode in its own namespace (the session's release is in device-plugin mode)."""
    k8skit.install_chart(cluster.admin_kubeconfig, RELEASE, RELEASE, {"mode": "dra"}, workdir)
    try:
        yield RELEASE
    finally:
        k8skit.helm(cluster.admin_kubeconfig, "uninstall", RELEASE, "--namespace", RELEASE, check=False)


@pytest.fixture
def plugin_slices(
    dra_release: str,
    cluster: controlplane.ControlPlane,
    core: kubernetes.client.CoreV1Api,
    nodes: list[str],
    namespace: str,
) -> tuple[kubernetes.client.ResourceV1Api, str, str]:
    """(the resource API with the DRA plugin's pod-bound token, its node A, another node B)."""
    node_a, node_b = f"{namespace}-a", f"{namespace}-b"
    for name in (node_a, node_b):
        core.create_node(k8skit.node_object(name))
        nodes.append(name)
    account = f"{dra_release}-gpuslice-dra-plugin"
    pod = k8skit.pod_object(f"dra-plugin-{namespace}", serviceAccountName=account, nodeName=node_a)
    plugin_pod = core.create_namespaced_pod(dra_release, pod)
    token = k8skit.service_account_token(core, dra_release, account, bound_pod=plugin_pod)
    client = k8skit.api_client(cluster.write_kubeconfig(f"{account}-{namespace}", token=token))
    api = kubernetes.client.ResourceV1Api(client)
    admin_api = kubernetes.client.ResourceV1Api(core.api_client)

    def in_force() -> bool | None:
        # The API server loads a new policy and its binding a moment after they are created (its
        # informer): until then a write it would refuse goes through, and is undone here.
        try:
            api.create_resource_slice(_slice(f"{node_b}-probe", node_b))
        except kubernetes.client.ApiException as exc:
            return exc.status == 403 or None
        admin_api.delete_resource_slice(f"{node_b}-probe")
        return None

    k8skit.wait_for("the slice policy to be in force", in_force, timeout=60, interval=0.5)
    return api, node_a, node_b


def _slice(name: str, node: str, driver: str = CONTRACT.dra_driver) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def _refused(call: Any) -> str:
    with pytest.raises(kubernetes.client.ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value
    return k8skit.api_error_message(refused.value)


def test_the_dra_plugin_may_write_only_its_own_nodes_slices_of_its_driver(
    plugin_slices: tuple[kubernetes.client.ResourceV1Api, str, str],
    admin: kubernetes.client.ApiClient,
) -> None:
    api, node_a, node_b = plugin_slices
    policy = kubernetes.client.AdmissionregistrationV1Api(admin).read_validating_admission_policy(
        f"{RELEASE}-gpuslice-resource-slices"
    )
    assert not (policy.status and policy.status.type_checking and policy.status.type_checking.expression_warnings)
    ours = f"{node_a}-gpu"
    admin_api = kubernetes.client.ResourceV1Api(admin)
    try:
        api.create_resource_slice(_slice(ours, node_a))  # its own node's: allowed
        api.patch_resource_slice(ours, {"spec": {"devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}})

        message = _refused(lambda: api.create_resource_slice(_slice(f"{node_b}-gpu", node_b)))
        assert f"only the ResourceSlices of the node its pod runs on ({node_a})" in message, message
        message = _refused(lambda: api.create_resource_slice(_slice(f"{node_a}-other", node_a, "gpu.example.com")))
        assert f"only ResourceSlices of its driver {CONTRACT.dra_driver}" in message, message
        # nodeName cannot change in place (the API's own validation says so); the policy's answer
        # comes first either way, and nothing changes.
        with pytest.raises(kubernetes.client.ApiException):
            api.patch_resource_slice(ours, {"spec": {"nodeName": node_b, "pool": {"name": node_b}}})
        assert admin_api.read_resource_slice(ours).spec.node_name == node_a

        admin_api.create_resource_slice(_slice(f"{node_b}-gpu", node_b))  # another node's plugin wrote it
        message = _refused(lambda: api.delete_resource_slice(f"{node_b}-gpu"))
        assert "only the ResourceSlices of the node its pod runs on" in message, message
        _refused(lambda: api.patch_resource_slice(f"{node_b}-gpu", {"spec": {"devices": []}}))
        assert [d.name for d in admin_api.read_resource_slice(f"{node_b}-gpu").spec.devices] == ["gpu-0"]

        api.delete_resource_slice(ours)  # its own: allowed
    finally:
        for name in (ours, f"{node_b}-gpu"):
            try:
                admin_api.delete_resource_slice(name)
            except kubernetes.client.ApiException:
                pass
