"""gpuslice.compact cuts a kubelet's node and a user's pod down to what gpuslice reads: every
reader gives the same answer from the compact object as from the whole one, which is far smaller."""

from __future__ import annotations

import copy
import json
from typing import Any

from gpuslice import affinity, compact, config
from gpuslice.pacer import ledger, release
from gpuslice.webhook import nodelabels, pods, waiting

CONTRACT = config.Config().contract
DECISION = json.dumps({"memoryMiB": 81920, "units": 64})


def kubelet_node() -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": "n1",
        CONTRACT.label_gpu_product: "H100",
        CONTRACT.label_gpu_memory_mib: "81920",
        CONTRACT.label_gpu_count: "2",
        CONTRACT.label_free_units: "600",
    }
    return {
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "labels": labels,
            "resourceVersion": "7",
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {"f:images": {}}}}] * 5,
        },
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "allocatable": {CONTRACT.gpu_memory_resource: "640", "cpu": "32", "memory": "256Gi"},
            "capacity": {CONTRACT.gpu_memory_resource: "640", "cpu": "32", "memory": "256Gi"},
            "conditions": [{"type": "Ready", "status": "True", "message": "kubelet is posting ready status"}] * 5,
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "images": [{"names": [f"registry.example/image-{i}:v1"], "sizeBytes": 10**9} for i in range(50)],
            "nodeInfo": {"kubeletVersion": "v1.37.2"},
        },
    }


def user_pod() -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "registry.example/train:v1",
        "command": ["python", "train.py"],
        "env": [{"name": f"VAR{i}", "value": "x" * 40} for i in range(20)],
        "resources": {"requests": {"cpu": "500m", CONTRACT.gpu_memory_resource: "64"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    sidecar = {**container, "name": "log", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "9",
            "creationTimestamp": "2026-11-29T00:00:00Z",
            "annotations": {
                CONTRACT.decision_annotation: DECISION,
                CONTRACT.gpu_class_annotation: "any",
                "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 4000 + "}",
            },
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "rs1", "controller": True}
            ],
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}] * 5,
        },
        "spec": {
            "containers": [container],
            "initContainers": [sidecar],
            "schedulingGates": [{"name": CONTRACT.pacing_gate}],
            "priority": 10,
            "nodeSelector": {"pool": "a"},
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/5 nodes " * 50}
            ],
        },
    }


def test_a_compact_node_reads_as_the_whole_one_at_a_fraction_of_its_size():
    whole = kubelet_node()
    small = compact.node(copy.deepcopy(whole))
    assert nodelabels.read(small["metadata"]["labels"], CONTRACT, status=small["status"]) == nodelabels.read(
        whole["metadata"]["labels"], CONTRACT, status=whole["status"]
    )
    assert small["metadata"]["labels"] == whole["metadata"]["labels"]
    assert set(small["status"]) == {"allocatable", "capacity"}
    assert len(json.dumps(small)) * 5 < len(json.dumps(whole))


def test_a_node_without_status_stays_without_one():
    assert compact.node({"metadata": {"name": "n1"}}) == {"metadata": {"name": "n1"}}


def test_a_compact_pod_gives_every_reader_the_same_answer():
    whole = user_pod()
    small = compact.pod(copy.deepcopy(whole), CONTRACT)
    assert pods.owner_of(small["metadata"], CONTRACT) == pods.owner_of(whole["metadata"], CONTRACT) == ""
    assert pods.cpu_requested(small["spec"]) == pods.cpu_requested(whole["spec"]) == 600
    assert (
        ledger.pod_demand(small["spec"], CONTRACT)
        == ledger.pod_demand(whole["spec"], CONTRACT)
        == {CONTRACT.gpu_memory_resource: 64}
    )
    assert release.gated(small, CONTRACT) == release.gated(whole, CONTRACT) is not None
    assert affinity.admits(small["spec"], "n1", {"pool": "a"}) and not affinity.admits(small["spec"], "n1", {})
    assert (
        waiting.unschedulable_decision(small, CONTRACT)
        == waiting.unschedulable_decision(whole, CONTRACT)
        == {
            "memoryMiB": 81920,
            "units": 64,
        }
    )
    assert len(json.dumps(small)) * 5 < len(json.dumps(whole))


def test_a_compact_pod_keeps_only_our_annotations_and_its_controller():
    whole = user_pod()
    whole["metadata"]["annotations"].pop(CONTRACT.gpu_class_annotation)
    small = compact.pod(whole, CONTRACT)
    assert set(small["metadata"]["annotations"]) == {CONTRACT.decision_annotation}
    assert pods.owner_of(small["metadata"], CONTRACT) == "rs1"
    assert "managedFields" not in small["metadata"] and "volumes" not in small["spec"]
    assert small["spec"]["containers"] == [
        {"name": "main", "resources": {"requests": {"cpu": "500m", CONTRACT.gpu_memory_resource: "64"}}}
    ]
    assert small["status"]["conditions"] == [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


def page_of(pods: list[dict[str, Any]], **metadata: str) -> bytes:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": pods}).encode()


def test_a_typed_page_gives_what_a_whole_parse_cut_down_gives():
    whole = user_pod()
    whole["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:x": {}}}}]
    whole["status"]["containerStatuses"] = [{"name": "main", "state": {"waiting": {}}}]
    bare = {"metadata": {"name": "q", "uid": "u2"}}  # no spec, no status
    data = page_of([whole, bare], resourceVersion="77", **{"continue": "next"})
    pods, token, version = compact.pod_page(data)
    assert (token, version) == ("next", "77")
    assert [compact.pod(p, CONTRACT) for p in pods] == [compact.pod(whole, CONTRACT), compact.pod(bare, CONTRACT)]
    assert "env" not in json.dumps(pods) and "managedFields" not in json.dumps(pods)  # never built
    assert compact.pod_page(page_of([], resourceVersion="78")) == ([], None, "78")


def test_a_typed_event_gives_the_pod_and_leaves_other_objects_whole():
    whole = user_pod()
    kind, obj = compact.pod_event(json.dumps({"type": "MODIFIED", "object": whole}).encode())
    assert kind == "MODIFIED" and compact.pod(obj, CONTRACT) == compact.pod(whole, CONTRACT)
    status = {"kind": "Status", "code": 410, "message": "too old resource version"}
    assert compact.pod_event(json.dumps({"type": "ERROR", "object": status}).encode()) == ("ERROR", status)
    bookmark = {
        "kind": "Pod",
        "metadata": {"resourceVersion": "90", "annotations": {"k8s.io/initial-events-end": "true"}},
    }
    assert compact.pod_event(json.dumps({"type": "BOOKMARK", "object": bookmark}).encode()) == ("BOOKMARK", bookmark)


def test_what_is_not_a_pod_list_or_event_is_a_value_error():
    import pytest

    for bad in (b'{"items": {"a": 1}}', b'{"items": [{"metadata": {"name": 5}}]}', b"[]"):
        with pytest.raises(ValueError):
            compact.pod_page(bad)
    with pytest.raises(ValueError):
        compact.pod_event(b'{"type": "ADDED", "object": {"spec": {"priority": "high"}}}')


def test_malformed_json_is_a_value_error_too():
    import pytest

    with pytest.raises(ValueError):
        compact.pod_page(b'{"items": [')
    with pytest.raises(ValueError):
        compact.pod_event(b"not json")


def test_a_dra_pod_s_claims_are_read_as_the_list_they_are():
    whole = user_pod()
    whole["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    pods, _, _ = compact.pod_page(page_of([whole]))
    assert compact.pod(pods[0], CONTRACT) == compact.pod(whole, CONTRACT)
    assert pods[0]["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
