"""The chart's ValidatingAdmissionPolicy on node writes, enforced by the real API server: a token of the
device plugin's ServiceAccount bound to a pod on node A (TokenRequest, as kubelet mounts it) may change
gpuslice labels of node A only. Other labels, the opt-in label, other nodes, annotations and taints are
refused with the policy's message.
"""

from __future__ import annotations

from typing import Any

import k8skit
import kubernetes
import pytest

from gpuslice import config as config_

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CONTRACT = config_.Config().contract


@pytest.fixture
def plugin_identity(
    release: Any, core: kubernetes.client.CoreV1Api, nodes: list[str], namespace: str
) -> tuple[kubernetes.client.CoreV1Api, str, str]:
    """(a client with the plugin's pod-bound token, its node A, another node B)."""
    node_a, node_b = f"{namespace}-a", f"{namespace}-b"
    for name in (node_a, node_b):
        core.create_node(k8skit.node_object(name, labels={CONTRACT.label_node_enabled: "true"}))
        nodes.append(name)
    account = f"{release.fullname}-device-plugin"
    pod = k8skit.pod_object(f"device-plugin-{namespace}", serviceAccountName=account, nodeName=node_a)
    plugin_pod = core.create_namespaced_pod(release.namespace, pod)
    client = k8skit.api_client(release.kubeconfig_of(account, bound_pod=plugin_pod))
    return kubernetes.client.CoreV1Api(client), node_a, node_b


def _refused(call: Any) -> str:
    with pytest.raises(kubernetes.client.ApiException) as refused:
        call()
    assert refused.value.status in (403, 422), refused.value
    return k8skit.api_error_message(refused.value)


def test_the_plugin_token_carries_its_node_and_may_change_that_nodes_gpuslice_labels(
    plugin_identity: tuple[kubernetes.client.CoreV1Api, str, str],
) -> None:
    api, node_a, _ = plugin_identity
    review = kubernetes.client.AuthenticationV1Api(api.api_client).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    assert review.status.user_info.extra["authentication.kubernetes.io/node-name"] == [node_a]
    api.patch_node(node_a, {"metadata": {"labels": {CONTRACT.label_free_units: "12", CONTRACT.label_gpu_count: "2"}}})
    labels = api.read_node(node_a).metadata.labels
    assert labels[CONTRACT.label_free_units] == "12"
    api.patch_node(node_a, {"metadata": {"labels": {CONTRACT.label_free_units: None}}})  # removing one is a change too
    assert CONTRACT.label_free_units not in api.read_node(node_a).metadata.labels


def test_the_plugin_may_not_change_another_node(plugin_identity: tuple[kubernetes.client.CoreV1Api, str, str]) -> None:
    api, _, node_b = plugin_identity
    message = _refused(lambda: api.patch_node(node_b, {"metadata": {"labels": {CONTRACT.label_free_units: "1"}}}))
    assert "may change only the node its pod runs on" in message


@pytest.mark.parametrize(
    "patch, expected",
    [
        ({"metadata": {"labels": {"team": "ml"}}}, "may change only labels under"),
        ({"metadata": {"labels": {CONTRACT.label_node_enabled: "false"}}}, "may change only labels under"),
        ({"metadata": {"labels": {CONTRACT.label_node_config: "other"}}}, "may change only labels under"),
        ({"metadata": {"annotations": {"example.com/note": "x"}}}, "may not change node annotations"),
        ({"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}}, "may not change the node's spec"),
        ({"spec": {"unschedulable": True}}, "may not change the node's spec"),
    ],
    ids=["foreign-label", "opt-in-label", "node-config-label", "annotation", "taint", "cordon"],
)
def test_the_plugin_may_not_change_anything_else_of_its_own_node(
    plugin_identity: tuple[kubernetes.client.CoreV1Api, str, str], patch: dict[str, Any], expected: str
) -> None:
    api, node_a, _ = plugin_identity
    before = api.read_node(node_a)
    assert expected in _refused(lambda: api.patch_node(node_a, patch))
    after = api.read_node(node_a)
    assert after.metadata.resource_version == before.metadata.resource_version  # nothing was half-applied
