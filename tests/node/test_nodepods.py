"""The watch of the node's pods (node/nodepods.py): it calls the labeller back only when what the
scheduler counts changes (a pod starts or ends, or a running pod is resized in place)."""

from __future__ import annotations

from labellerkit import NODE, pod

from gpuslice.node import labeller, nodepods


def test_the_node_pod_watch_calls_back_only_when_pods_start_or_end():
    calls = []
    pods = nodepods.NodePods(lambda: None, NODE, on_change=lambda: calls.append(1))
    a = {**pod("Pending", "1", "1Gi"), "metadata": {"uid": "a"}}
    pods.replace([a])
    assert len(calls) == 1
    pods.replace([a])  # a relist with the same pods
    pods.apply("MODIFIED", {**a, "status": {"phase": "Running"}})
    assert len(calls) == 1
    pods.apply("MODIFIED", {**a, "status": {"phase": "Succeeded"}})  # ended: its requests are free again
    assert len(calls) == 2
    pods.apply("DELETED", {**a, "status": {"phase": "Succeeded"}})  # already counted as ended
    assert len(calls) == 2
    pods.apply("ADDED", {**pod("Running", "1", "1Gi"), "metadata": {"uid": "b"}})
    pods.apply("DELETED", {**pod("Running", "1", "1Gi"), "metadata": {"uid": "b"}})
    assert len(calls) == 4


def test_the_pod_watch_calls_back_when_a_running_pod_is_resized_in_place():
    calls: list[int] = []
    pods = nodepods.NodePods(lambda: None, NODE, on_change=lambda: calls.append(1))
    running = {**pod("Running", "2", "1Gi"), "metadata": {"uid": "a"}}
    pods.replace([running])
    assert len(calls) == 1
    # Asked down to 1 CPU: kubelet still runs it at 2, so the scheduler still counts 2: no change.
    smaller = {
        "metadata": {"uid": "a"},
        "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "a", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
        },
    }
    pods.apply("MODIFIED", smaller)
    assert len(calls) == 1
    carried_out = {
        **smaller,
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "a",
                    "allocatedResources": {"cpu": "1", "memory": "1Gi"},
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
        },
    }
    pods.apply("MODIFIED", carried_out)  # kubelet resized it: 1 CPU given back
    assert len(calls) == 2
    assert labeller.headroom_from({"cpu": "4", "memory": "8Gi"}, pods.pods()) == (3000, 7168)
