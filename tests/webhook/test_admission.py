"""AdmissionReview v1 in and out, as kube-apiserver sends and reads it."""

from __future__ import annotations

import base64
import dataclasses
import json
import pathlib
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from gpuslice import config
from gpuslice.webhook import admission, cluster

SETTINGS = config.Config()


def view() -> cluster.ClusterView:
    return cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)


def pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "job-", "namespace": "team-a"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


def review(obj: dict[str, Any] | None = None, **request: Any) -> dict[str, Any]:
    """An AdmissionReview for a pod CREATE, shaped as kube-apiserver sends it."""
    body: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "userInfo": {
            "username": "system:serviceaccount:kube-system:replicaset-controller",
            "groups": ["system:serviceaccounts"],
        },
        "object": obj if obj is not None else pod({"gpu-fraction": "0.5"}),
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    body.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


def answer(body: Any) -> admission.Result:
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body).encode()
    return admission.review(raw, settings=SETTINGS, cluster=view())


def test_a_converted_pod_gets_a_base64_json_patch_under_the_request_uid() -> None:
    request = review()
    result = answer(request)
    response = result.response
    assert response["apiVersion"] == "admission.k8s.io/v1" and response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == request["request"]["uid"]
    assert response["response"]["allowed"] is True and response["response"]["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["response"]["patch"]))
    patched = jsonpatch.apply_patch(request["request"]["object"], patch)
    kubernetes_validate.validate(patched, "1.35", strict=True)
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {"gpuslice.io/gpu-memory": "160"}
    assert result.result == admission.RESULT_MUTATED and result.outcome is not None


def test_a_denied_pod_gets_allowed_false_and_the_reason_without_a_patch() -> None:
    result = answer(review(pod({"gpu-fraction": "2"})))
    response = result.response["response"]
    assert response["allowed"] is False and "patch" not in response
    assert "gpu-fraction='2'" in response["status"]["message"] and response["status"]["code"] == 400
    assert result.result == admission.RESULT_DENIED


def test_a_pod_without_annotations_is_allowed_without_a_patch() -> None:
    raw = json.dumps(review(pod())).encode()
    result = admission.review(raw, settings=dataclasses.replace(SETTINGS, convert_whole_gpus=False), cluster=view())
    assert result.response["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    assert result.result == admission.RESULT_UNCHANGED


@pytest.mark.parametrize(
    "request_fields",
    [
        {"namespace": "kube-system"},
        {"operation": "UPDATE"},
        {"resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "status"},
        {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    ],
    ids=["ignored-namespace", "update", "subresource", "other-resource"],
)
def test_requests_the_webhook_does_not_convert_are_allowed_untouched(request_fields: dict[str, Any]) -> None:
    result = answer(review(**request_fields))
    assert result.response["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    assert result.result == admission.RESULT_IGNORED and result.outcome is None


def test_a_dry_run_is_answered_like_a_real_request_and_flagged_as_dry() -> None:
    real, dry = answer(review()), answer(review(dryRun=True))
    assert dry.response == real.response
    assert dry.dry_run and not real.dry_run


def test_the_uid_of_each_request_is_echoed() -> None:
    for uid in ("a", "b-1", "c" * 36):
        assert answer(review(uid=uid)).response["response"]["uid"] == uid


MALFORMED = [
    ("not-json", b"{not json", "not JSON"),
    ("not-utf8", b"\xff\xfe", "not JSON"),
    ("array", b"[]", "JSON object"),
    ("wrong-kind", {"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}, "expected kind AdmissionReview"),
    (
        "v1beta1",
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}},
        "apiVersion",
    ),
    ("no-request", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "no request"),
    (
        "no-uid",
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": "CREATE"}},
        "no uid",
    ),
    ("no-object", review(object=None) | {"request": {**review()["request"], "object": None}}, "no object"),
    ("request-a-list", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}, "no request"),
    ("uid-a-number", review(uid=7), "no uid"),
    ("resource-a-string", review(resource="pods"), "request.resource"),
    ("namespace-a-list", review(namespace=["team-a"]), "request.namespace"),
    ("dry-run-a-string", review(dryRun="yes"), "request.dryRun"),
    ("object-a-string", review(object="a pod"), "no object"),
    ("metadata-a-list", review(object={**pod(), "metadata": []}), r"object\.metadata must be an object"),
    (
        "annotations-a-list",
        review(object={**pod(), "metadata": {"annotations": ["gpu-fraction"]}}),
        r"object\.metadata\.annotations must be an object",
    ),
    (
        "annotation-value-a-number",
        review(object=pod({"gpu-fraction": 0.5})),  # type: ignore[dict-item]
        r"annotations\['gpu-fraction'\] must be a string",
    ),
    ("spec-a-string", review(object={**pod(), "spec": "GPU"}), r"object\.spec must be an object"),
    ("containers-an-object", review(object={**pod(), "spec": {"containers": {}}}), "containers must be a list"),
    ("container-a-string", review(object={**pod(), "spec": {"containers": ["main"]}}), r"containers\[0\] must be"),
    (
        "limits-a-list",
        review(object={**pod(), "spec": {"containers": [{"name": "m", "resources": {"limits": ["nvidia.com/gpu"]}}]}}),
        "limits must be an object",
    ),
    (
        "quantity-an-object",
        review(object={**pod(), "spec": {"containers": [{"name": "m", "resources": {"limits": {"cpu": {}}}}]}}),
        r"limits\['cpu'\] must be a quantity",
    ),
    (
        "node-selector-terms-a-string",
        review(
            object={
                **pod({"gpu-fraction": "0.5"}),
                "spec": {
                    "containers": [{"name": "m"}],
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}
                    },
                },
            }
        ),
        "nodeSelectorTerms must be a list",
    ),
    (
        "owner-references-an-object",
        review(object={**pod(), "metadata": {"ownerReferences": {"kind": "DaemonSet"}}}),
        "ownerReferences must be a list",
    ),
]


@pytest.mark.parametrize(("body", "words"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_reviews_raise_a_typed_error_with_a_message(body: Any, words: str) -> None:
    with pytest.raises(admission.MalformedReview, match=words):
        answer(body)


# --- a burst: conversions ahead of the labels ------------------------------------------------


def two_class_view() -> cluster.ClusterView:
    """The demo node (2 x H100 80GB) and an 8 x H200 node, all free, labelled by the plugin's code."""
    from gpuslice.node import labels as node_labels
    from gpuslice.node import nodefile

    examples = pathlib.Path(__file__).resolve().parents[2] / "gpuslice" / "examples"
    built = view()
    for name, file in (("demo", "demo-node.yaml"), ("h200", "h200x8-node.yaml")):
        built.update_node(name, node_labels.node_labels(nodefile.load(examples / file), SETTINGS.contract))
    return built


def classes_of_a_burst(cluster_view: cluster.ClusterView, pods: int, **request: Any) -> list[int]:
    chosen = []
    for _ in range(pods):
        result = admission.review(json.dumps(review(**request)).encode(), settings=SETTINGS, cluster=cluster_view)
        assert result.outcome is not None and result.outcome.decision is not None
        chosen.append(result.outcome.decision["classMemoryMiB"])
    return chosen


def test_a_burst_spreads_over_the_classes_by_what_earlier_conversions_took() -> None:
    # Labels do not move during a burst: without promises every pod would see the same free shares
    # and be pinned to the same class (the H200s), which fills while the H100s stay idle.
    chosen = classes_of_a_burst(two_class_view(), 12)
    # Largest free share first: the H100s (4 halves) and the H200s (16 halves) fill at the same pace.
    assert chosen.count(81559) in (2, 3) and chosen.count(143771) in (9, 10), chosen
    # A dry run converts the same way but promises nothing.
    dry = two_class_view()
    assert set(classes_of_a_burst(dry, 4, dryRun=True)) == {143771}


def test_promised_units_leave_when_the_labels_show_them_or_when_they_expire() -> None:
    view_ = two_class_view()
    view_.ledger.promise(81559, 159, now=0.0)
    view_.ledger.promise(81559, 159, now=1.0)
    assert view_.ledger.promised_units(81559, now=2.0) == 318
    # The plugin's labeller writes the first allocation: 159 fewer free units on the demo node.
    from gpuslice.node import labels as node_labels
    from gpuslice.node import nodefile

    examples = pathlib.Path(__file__).resolve().parents[2] / "gpuslice" / "examples"
    demo = nodefile.load(examples / "demo-node.yaml")
    view_.update_node("demo", node_labels.node_labels(demo, SETTINGS.contract, allocated={demo.gpus[0].uuid: 159}))
    assert view_.ledger.promised_units(81559, now=2.0) == 159
    assert view_.ledger.promised_units(81559, now=1.0 + cluster.PROMISE_SECONDS) == 0


def cpu_bound_view(h200_cpu_milli: int | None, h100_cpu_milli: int | None = 200_000) -> cluster.ClusterView:
    """As `two_class_view`, each node publishing the CPU its pods have not requested (None: not published)."""
    from gpuslice.node import labels as node_labels
    from gpuslice.node import nodefile

    examples = pathlib.Path(__file__).resolve().parents[2] / "gpuslice" / "examples"
    built = view()
    for name, file, cpu in (("demo", "demo-node.yaml", h100_cpu_milli), ("h200", "h200x8-node.yaml", h200_cpu_milli)):
        headroom = None if cpu is None else (cpu, 1_000_000)
        built.update_node(
            name, node_labels.node_labels(nodefile.load(examples / file), SETTINGS.contract, headroom=headroom)
        )
    return built


def half_gpu_pod(cpu: str) -> dict[str, Any]:
    body = pod({"gpu-fraction": "0.5"})
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    return body


def test_promised_pods_hold_the_cpu_beside_their_units_so_a_class_short_of_cpu_gets_no_more() -> None:
    # The H200 node has the most GPU memory free (16 halves) but CPU for three pods of 8 cores; the
    # H100 node has CPU for many. Labels do not move during the burst: once pods are promised CPU
    # there, the H200 class counts the room its CPU leaves, the H100 class its four halves.
    burst = classes_of_a_burst(cpu_bound_view(h200_cpu_milli=24_000), 7, object=half_gpu_pod("8"))
    assert burst.count(81559) == 4 and burst.count(143771) == 3, burst
    # Pods that ask for no CPU are bounded by GPU memory alone: the H200s take most of them.
    assert classes_of_a_burst(cpu_bound_view(h200_cpu_milli=24_000), 7).count(143771) >= 5


def rule_of_next(view_: cluster.ClusterView, obj: dict[str, Any]) -> str:
    result = admission.review(json.dumps(review(obj)).encode(), settings=SETTINGS, cluster=view_)
    assert result.outcome is not None and result.outcome.decision is not None
    return str(result.outcome.decision["rule"])


def test_cpu_given_back_with_a_promise_makes_room_again() -> None:
    view_ = cpu_bound_view(h200_cpu_milli=24_000)
    burst = classes_of_a_burst(view_, 7, object=half_gpu_pod("8"))
    # The same burst, nothing given back: no class has room for an eighth pod.
    full = cpu_bound_view(h200_cpu_milli=24_000)
    assert classes_of_a_burst(full, 7, object=half_gpu_pod("8")) == burst
    assert rule_of_next(full, half_gpu_pod("8")).endswith("(no node has room now)")
    # The scheduler found no node for the last H200 pod (webhook/waiting.py): its units and CPU return.
    view_.ledger.release_conversion({"classMemoryMiB": 143771, "units": 280})
    assert rule_of_next(view_, half_gpu_pod("8")) == "largest free share on nodes where the pod fits now"


def test_a_node_that_publishes_no_cpu_headroom_does_not_bound_its_class_by_cpu() -> None:
    assert classes_of_a_burst(cpu_bound_view(h200_cpu_milli=None), 6, object=half_gpu_pod("8")).count(143771) >= 5
