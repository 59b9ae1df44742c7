"""gpuslice.podwire: pods read from the API server's protobuf encoding come out as the typed JSON
decode (gpuslice.compact) makes them, frames are found in a stream however it is cut, and bad
input is refused with a ValueError naming it. The bytes here are written with proto/kubeapi's own
messages, laid out as the API server lays them out; tests/e2e/test_real_control_plane.py reads
the real API server's both ways and compares them."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from podwirekit import encode_pod, envelope, frame

from gpuslice import compact, config, podwire
from gpuslice.proto.kubeapi.v1 import api_pb2 as pb

CONTRACT = config.Config().contract

# A pod with every field the decode keeps, and some it skips (env, volumes, preferences).
POD: dict[str, Any] = {
    "metadata": {
        "name": "trainer-0",
        "namespace": "team-a",
        "uid": "0b7f3c1e-0000-4b8e-9a57-2f1d3c0e9a11",
        "resourceVersion": "4711",
        "creationTimestamp": "2026-11-29T14:57:06Z",
        "deletionTimestamp": "2026-11-29T15:00:00Z",
        "labels": {"app": "trainer"},
        "annotations": {"gpu-fraction": "0.5", "gpuslice.io/decision": '{"units": 160}'},
        "ownerReferences": [
            {"kind": "ReplicaSet", "name": "trainer-7c9f", "uid": "u-1", "controller": True},
            {"kind": "Workflow", "name": "w", "uid": "u-2"},
        ],
    },
    "spec": {
        "nodeName": "node-7",
        "schedulingGates": [{"name": "gpuslice.io/pacing"}],
        "priority": 0,
        "nodeSelector": {"gpuslice.io/gpu.product": "NVIDIA-H100"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu.free-units", "operator": "Gt", "values": ["159"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]},
                        {"matchExpressions": [{"key": "gpuslice.io/gpu", "operator": "Exists"}]},
                    ]
                },
            }
        },
        "overhead": {"cpu": "250m"},
        "containers": [
            {
                "name": "main",
                "resources": {
                    "limits": {"gpuslice.io/gpu-memory": "160", "memory": "16Gi"},
                    "requests": {"cpu": "4", "gpuslice.io/gpu-memory": "160", "memory": "16Gi"},
                    "claims": [{"name": "gpu"}, {"name": "gpu2", "request": "share"}],
                },
            },
            {"name": "plain", "resources": {}},
        ],
        "initContainers": [{"name": "sidecar", "resources": {}, "restartPolicy": "Always"}],
    },
    "status": {
        "phase": "Pending",
        "reason": "Evicted",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
            {"type": "Ready", "status": "True"},
        ],
    },
}

# What the decode skips, as the API server sends it beside the rest.
SKIPPED: dict[str, Any] = {
    "env": [{"name": "A", "value": "x" * 100}],
    "image": "registry.example/trainer:1",
}


def as_json_event(event_type: str, pod: dict[str, Any]) -> bytes:
    whole = copy.deepcopy(pod)
    whole["spec"]["containers"][0].update(SKIPPED)
    return json.dumps({"type": event_type, "object": whole}).encode()


def test_a_pod_from_protobuf_is_the_typed_json_decode_of_the_same_pod() -> None:
    frames = list(podwire.frames([frame("ADDED", "Pod", encode_pod(POD))]))
    assert podwire.pod_event(frames[0]) == compact.pod_event(as_json_event("ADDED", POD))
    # and so what the watches keep of it too
    whole = json.loads(as_json_event("ADDED", POD))["object"]
    assert compact.pod(podwire.pod_event(frames[0])[1], CONTRACT) == compact.pod(whole, CONTRACT)


@pytest.mark.parametrize(
    "trim",
    [
        lambda p: p["metadata"].pop("deletionTimestamp"),
        lambda p: p["metadata"]["ownerReferences"].clear() or p["metadata"].pop("ownerReferences"),
        lambda p: p["spec"].pop("priority"),
        lambda p: p["spec"].pop("affinity"),
        lambda p: p["spec"].pop("nodeName") and p["status"].pop("reason"),
        lambda p: p["spec"]["containers"][0].pop("resources"),
        lambda p: p.update(status={}),
    ],
    ids=["not-deleted", "no-owners", "no-priority", "no-affinity", "unbound", "no-resources", "no-status"],
)
def test_fields_left_out_are_left_out_of_both(trim: Any) -> None:
    pod = copy.deepcopy(POD)
    trim(pod)
    frames = list(podwire.frames([frame("MODIFIED", "Pod", encode_pod(pod))]))
    assert podwire.pod_event(frames[0]) == compact.pod_event(as_json_event("MODIFIED", pod))


def test_only_a_preferred_affinity_keeps_no_affinity() -> None:
    pod = copy.deepcopy(POD)
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}]
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    # On the wire: NodeAffinity's field 2 (preferred), which proto/kubeapi does not declare.
    message = pb.Pod.FromString(encode_pod({**pod, "spec": {k: v for k, v in pod["spec"].items() if k != "affinity"}}))
    message.spec.affinity.nodeAffinity.MergeFromString(b"\x12\x02\x08\x01")  # one term, weight 1
    (only,) = podwire.frames([frame("ADDED", "Pod", message.SerializeToString())])
    _, decoded = podwire.pod_event(only)
    assert "affinity" not in decoded["spec"]
    whole = json.loads(as_json_event("ADDED", pod))["object"]
    assert compact.pod(decoded, CONTRACT) == compact.pod(whole, CONTRACT)  # what the watches keep, alike


def test_a_page_gives_its_pods_token_and_version() -> None:
    pods = [copy.deepcopy(POD) for _ in range(3)]
    for i, pod in enumerate(pods):
        pod["metadata"]["name"] = f"p{i}"
    page = pb.PodList(items=[pb.Pod.FromString(encode_pod(p)) for p in pods])
    page.metadata.resourceVersion = "99"
    setattr(page.metadata, "continue", "token-1")
    items, token, version = podwire.pod_page(envelope("PodList", page.SerializeToString()))
    assert (token, version) == ("token-1", "99")
    assert items == [compact.pod_event(as_json_event("ADDED", p))[1] for p in pods]
    last = pb.PodList()
    last.metadata.resourceVersion = "100"
    assert podwire.pod_page(envelope("PodList", last.SerializeToString())) == ([], None, "100")


def test_the_bookmark_ending_a_streamed_list_carries_its_version_and_annotation() -> None:
    bookmark = pb.Pod()
    bookmark.metadata.resourceVersion = "316"
    bookmark.metadata.annotations["k8s.io/initial-events-end"] = "true"
    (only,) = podwire.frames([frame("BOOKMARK", "Pod", bookmark.SerializeToString())])
    kind, obj = podwire.pod_event(only)
    assert kind == "BOOKMARK"
    assert obj["metadata"] == {"resourceVersion": "316", "annotations": {"k8s.io/initial-events-end": "true"}}


def test_an_error_event_gives_the_status_code_the_watch_acts_on() -> None:
    status = pb.Status(status="Failure", code=410, reason="Expired", message="too old resource version")
    (only,) = podwire.frames([frame("ERROR", "Status", status.SerializeToString())])
    assert podwire.pod_event(only) == (
        "ERROR",
        {
            "kind": "Status",
            "status": "Failure",
            "code": 410,
            "reason": "Expired",
            "message": "too old resource version",
        },
    )


def test_frames_are_found_however_the_stream_is_cut() -> None:
    stream = b"".join(frame("ADDED", "Pod", encode_pod({**POD, "metadata": {"name": f"p{i}"}})) for i in range(20))
    whole = list(podwire.frames([stream]))
    assert len(whole) == 20
    rng = random.Random(5)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 60)))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        assert list(podwire.frames(pieces)) == whole
    assert list(podwire.frames([bytes([b]) for b in stream])) == whole


@pytest.mark.parametrize(
    ("call", "data", "named"),
    [
        (podwire.pod_page, b'{"kind": "PodList"}', "no k8s envelope"),
        (podwire.pod_page, b"k8s\x00\xff\xff", "not a protobuf object"),
        (podwire.pod_page, envelope("NodeList", b""), "not a pod list: a NodeList"),
        (podwire.pod_event, b"\xff\xff\xff", "not a watch event"),
        (
            podwire.pod_event,
            pb.WatchEvent(type="ADDED", object=pb.RawExtension(raw=envelope("Node", b""))).SerializeToString(),
            "of a Node, not a pod",
        ),
        (
            podwire.pod_event,
            pb.WatchEvent(type="ADDED", object=pb.RawExtension(raw=envelope("Pod", b"\x0a\xff"))).SerializeToString(),
            "not a Pod",
        ),
    ],
    ids=["json", "garbage", "other-list", "garbage-event", "other-kind", "truncated-pod"],
)
def test_bad_input_is_refused_naming_what_it_is_not(call: Any, data: bytes, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        call(data)


def test_a_stream_that_ends_inside_a_frame_or_claims_a_huge_one_is_refused() -> None:
    one = frame("ADDED", "Pod", encode_pod(POD))
    with pytest.raises(ValueError, match="ended inside a frame"):
        list(podwire.frames([one, one[:10]]))
    with pytest.raises(ValueError, match="not a protobuf watch stream"):
        list(podwire.frames([b'{"type": "ADDED"}\n']))  # JSON read as frames: a length of 2 GB


def test_which_responses_are_protobuf() -> None:
    assert podwire.is_protobuf("application/vnd.kubernetes.protobuf")
    assert podwire.is_protobuf("application/vnd.kubernetes.protobuf;stream=watch")
    assert not podwire.is_protobuf("application/json")
    assert not podwire.is_protobuf(None)
