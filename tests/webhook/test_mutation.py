"""The pure conversion: pods as kube-apiserver hands them to the webhook, every patch applied with
jsonpatch and the result validated (strict) against the Pod schema of Kubernetes 1.29 to 1.35."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pathlib
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from gpuslice import config
from gpuslice.node import labels as node_labels
from gpuslice.node import nodefile
from gpuslice.webhook import cluster, conversions, cpudemand, mutation, pods, steering

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "gpuslice" / "examples"
SHARED = pathlib.Path(os.environ.get("GPUSLICE_SHARED_DIR", REPO.parent / "shared"))
KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35")
SETTINGS = config.Config()
CONTRACT = SETTINGS.contract
H100_MIB, H200_MIB = 81559, 143771  # the example node files' GPU memory
H100_PRODUCT, H200_PRODUCT = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"
GPU_MEMORY = CONTRACT.gpu_memory_resource


# --- helpers -------------------------------------------------------------------------------


def make_view(*, h200_free_units: int | None = None, settings: config.Config = SETTINGS) -> cluster.ClusterView:
    """The demo node (2 x H100 + MIG A100) and an 8 x H200 node, labelled by the device plugin's own code."""
    view = cluster.ClusterView(settings.contract, default_gpu_memory_mib=settings.default_gpu_memory_mib)
    view.update_node("demo", node_labels.node_labels(nodefile.load(EXAMPLES / "demo-node.yaml"), settings.contract))
    h200 = node_labels.node_labels(nodefile.load(EXAMPLES / "h200x8-node.yaml"), settings.contract)
    if h200_free_units is not None:
        h200[settings.contract.label_free_units] = str(h200_free_units)
    view.update_node("h200", h200)
    return view


def empty_view(settings: config.Config = SETTINGS) -> cluster.ClusterView:
    return cluster.ClusterView(settings.contract, default_gpu_memory_mib=settings.default_gpu_memory_mib)


def container(name: str = "main", **resources: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": "registry.example/train:1.0"}
    if resources:
        body["resources"] = resources
    return body


def deployment_pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod as a ReplicaSet creates it: generateName, no name, owner reference, defaulted fields."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-7c9f8d6b5-",
            "namespace": "team-a",
            "labels": {"app": "trainer", "pod-template-hash": "7c9f8d6b5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7c9f8d6b5",
                    "uid": "0b7f3c1e-6a39-4b8e-9a57-2f1d3c0e9a11",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [container(limits={"nvidia.com/gpu": "1"})],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
    }
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    pod["spec"].update(spec)
    return pod


def validate_pod(pod: dict[str, Any]) -> None:
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(pod, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"patched pod is not a valid Pod for Kubernetes {version}: {str(exc).splitlines()[0]}")
    check_extended_resources(pod)


def check_extended_resources(pod: dict[str, Any]) -> None:
    """What the API server checks beyond the schema for extended resources."""
    for field in ("containers", "initContainers"):
        for entry in pod["spec"].get(field) or ():
            requests = (entry.get("resources") or {}).get("requests") or {}
            limits = (entry.get("resources") or {}).get("limits") or {}
            for name in set(requests) | set(limits):
                if CONTRACT.is_gpuslice_resource(name):
                    assert requests.get(name) == limits.get(name), f"{name}: requests must equal limits"
                    assert str(limits[name]).isdigit(), f"{name}: extended resources are whole numbers"


def convert(
    pod: dict[str, Any], *, settings: config.Config = SETTINGS, view: cluster.ClusterView | None = None
) -> tuple[mutation.Outcome, dict[str, Any]]:
    """Mutate, check nothing was changed in place, apply the patch and validate the result."""
    original = copy.deepcopy(pod)
    outcome = mutation.mutate(pod, settings=settings, cluster=view if view is not None else make_view())
    assert pod == original, "mutate must not change its input"
    if not outcome.allowed:
        assert outcome.patch == [], "a denied pod gets no patch"
        return outcome, pod
    patched = jsonpatch.apply_patch(pod, outcome.patch)
    validate_pod(patched)
    return outcome, patched


def units_of(pod: dict[str, Any], index: int = 0, field: str = "containers") -> dict[str, Any]:
    resources = pod["spec"][field][index].get("resources") or {}
    return {"requests": resources.get("requests") or {}, "limits": resources.get("limits") or {}}


def decision(pod: dict[str, Any]) -> dict[str, Any]:
    return json.loads(pod["metadata"]["annotations"][CONTRACT.decision_annotation])


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    node_affinity = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    return node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])


def pin(memory_mib: int) -> dict[str, Any]:
    return {"key": CONTRACT.label_gpu_memory_mib, "operator": "In", "values": [str(memory_mib)]}


# --- conversions ---------------------------------------------------------------------------


def test_gpu_memory_becomes_units_rounded_up_and_the_placeholder_is_removed() -> None:
    outcome, pod = convert(deployment_pod({"gpu-memory": "2000"}))
    assert outcome.allowed and outcome.kind == conversions.KIND_MEMORY
    assert units_of(pod) == {"requests": {GPU_MEMORY: "8"}, "limits": {GPU_MEMORY: "8"}}  # ceil(2000 / 256)
    assert decision(pod)["memoryMiB"] == 8 * 256 and decision(pod)["requestedMiB"] == 2000


@pytest.mark.parametrize(
    ("value", "units"),
    [
        ("20Gi", 80),
        ("512Mi", 2),
        ("1.5Gi", 6),
        ("1000M", 4),
        ("2000", 8),
        ("257", 2),
        ("2e3", 8),
        ("2E3", 8),
        (".5Gi", 2),
    ],
    ids=[
        "Gi",
        "Mi",
        "fractional-Gi",
        "decimal-M",
        "plain-MiB",
        "just-over-one-unit",
        "exponent",
        "capital-exponent",
        "no-leading-digit",
    ],
)
def test_gpu_memory_accepts_kubernetes_quantities(value: str, units: int) -> None:
    _, pod = convert(deployment_pod({"gpu-memory": value}))
    assert units_of(pod)["limits"] == {GPU_MEMORY: str(units)}


def test_gpu_memory_that_only_the_larger_gpus_hold_is_pinned_to_them() -> None:
    _, pod = convert(deployment_pod({"gpu-memory": "100000"}))
    assert units_of(pod)["limits"] == {GPU_MEMORY: "391"}
    assert all(pin(H200_MIB) in term["matchExpressions"] for term in required_terms(pod))


def test_gpu_memory_that_every_gpu_holds_is_not_pinned() -> None:
    _, pod = convert(
        deployment_pod({"gpu-memory": "2000"}),
        settings=dataclasses.replace(SETTINGS, steering=config.SteeringConfig(enabled=False)),
    )
    assert "affinity" not in pod["spec"]


def test_gpu_fraction_takes_the_class_with_the_largest_free_share_and_pins_it() -> None:
    # Both nodes empty: equal shares, so the class with more GPUs (H200) wins.
    _, pod = convert(deployment_pod({"gpu-fraction": "0.5"}))
    assert units_of(pod)["limits"] == {GPU_MEMORY: "280"}  # floor(0.5 * (143771 // 256))
    assert decision(pod)["classMemoryMiB"] == H200_MIB and decision(pod)["products"] == [H200_PRODUCT]
    assert all(pin(H200_MIB) in term["matchExpressions"] for term in required_terms(pod))


def test_gpu_fraction_moves_to_another_class_when_the_first_fills_up() -> None:
    _, pod = convert(deployment_pod({"gpu-fraction": "0.5"}), view=make_view(h200_free_units=100))
    assert units_of(pod)["limits"] == {GPU_MEMORY: "159"}  # floor(0.5 * (81559 // 256))
    assert decision(pod)["classMemoryMiB"] == H100_MIB
    assert all(pin(H100_MIB) in term["matchExpressions"] for term in required_terms(pod))


def test_gpu_fraction_takes_the_class_whose_nodes_have_room_for_the_pods_memory_request() -> None:
    view = make_view()
    h200 = node_labels.node_labels(nodefile.load(EXAMPLES / "h200x8-node.yaml"), CONTRACT)
    view.update_node("h200", {**h200, CONTRACT.label_free_memory_mib: "4096", CONTRACT.label_free_cpu_milli: "64000"})
    roomy = deployment_pod({"gpu-fraction": "0.5"})
    roomy["spec"]["containers"][0]["resources"]["requests"] = {"memory": "2Gi", "cpu": "1"}
    _, pod = convert(roomy, view=view)
    assert pin(H200_MIB) in required_terms(pod)[0]["matchExpressions"]  # fits beside the H200s
    big = deployment_pod({"gpu-fraction": "0.5"})
    big["spec"]["containers"][0]["resources"]["requests"] = {"memory": "16Gi", "cpu": "1"}
    _, pod = convert(big, view=view)
    assert pin(H100_MIB) in required_terms(pod)[0]["matchExpressions"]  # 16 GiB does not fit there


@pytest.mark.parametrize(
    "selection",
    [
        {"nodeSelector": {"nvidia.com/gpu.product": H100_PRODUCT}},
        {"nodeSelector": {"gpuslice.io/gpu.product": H100_PRODUCT}},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100_PRODUCT]}
                                ]
                            }
                        ]
                    }
                }
            }
        },
    ],
    ids=["nvidia-node-selector", "gpuslice-node-selector", "required-affinity"],
)
def test_gpu_fraction_respects_a_product_the_pod_already_selects(selection: dict[str, Any]) -> None:
    _, pod = convert(deployment_pod({"gpu-fraction": "0.5"}, **copy.deepcopy(selection)))
    assert decision(pod)["classMemoryMiB"] == H100_MIB
    assert units_of(pod)["limits"] == {GPU_MEMORY: "159"}
    if "nodeSelector" in selection:
        assert pod["spec"]["nodeSelector"] == selection["nodeSelector"]
    else:
        product = selection["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert product["nodeSelectorTerms"][0]["matchExpressions"][0] in required_terms(pod)[0]["matchExpressions"]


@pytest.mark.parametrize(("fraction", "units"), [("1", 561), ("1.0", 561), ("0.9999", 560), ("0.2", 112), ("0.001", 1)])
def test_a_fraction_is_rounded_down_to_whole_units_of_one_gpu(fraction: str, units: int) -> None:
    # 143771 // 256 = 561 units per GPU; never more than a GPU has, at least one unit.
    _, pod = convert(deployment_pod({"gpu-fraction": fraction}))
    assert units_of(pod)["limits"] == {GPU_MEMORY: str(units)}


def test_without_a_cluster_view_a_fraction_uses_default_gpu_memory_and_pins_nothing() -> None:
    settings = dataclasses.replace(SETTINGS, steering=config.SteeringConfig(enabled=False))
    _, pod = convert(deployment_pod({"gpu-fraction": "0.5"}), settings=settings, view=empty_view())
    assert units_of(pod)["limits"] == {GPU_MEMORY: "160"}  # 0.5 * 81920 / 256
    assert "affinity" not in pod["spec"]
    assert decision(pod)["classMemoryMiB"] == 81920


@pytest.mark.parametrize(
    ("annotations", "profile"),
    [
        ({"gpu-memory": "5000"}, "1g.10gb"),
        ({"gpu-memory": "9728"}, "1g.10gb"),
        ({"gpu-memory": "15Gi"}, "2g.20gb"),
        ({"gpu-fraction": "0.25"}, "3g.40gb"),  # 0.25 x 143771 MiB (the chosen class) = 35943 MiB
    ],
    ids=["small", "exactly-a-profile", "quantity", "fraction"],
)
def test_mig_isolation_takes_the_smallest_profile_that_holds_the_request(
    annotations: dict[str, str], profile: str
) -> None:
    outcome, pod = convert(deployment_pod({**annotations, "gpuslice.io/isolation": "mig"}))
    assert outcome.kind == conversions.KIND_MIG
    resource = CONTRACT.mig_resource(profile)
    assert units_of(pod) == {"requests": {resource: "1"}, "limits": {resource: "1"}}
    assert decision(pod)["migProfile"] == profile


def test_the_container_named_by_the_annotation_gets_the_share_and_others_are_untouched() -> None:
    sidecar = container("sidecar", requests={"cpu": "100m"}, limits={"memory": "64Mi"})
    pod = deployment_pod(
        {"gpu-memory": "4096", "gpu-fraction-container-name": "worker"},
        containers=[sidecar, container("worker", limits={"cpu": "2", "memory": "8Gi"})],
    )
    _, patched = convert(pod)
    assert patched["spec"]["containers"][0] == sidecar
    assert units_of(patched, 1) == {
        "requests": {GPU_MEMORY: "16"},
        "limits": {"cpu": "2", "memory": "8Gi", GPU_MEMORY: "16"},
    }


def test_init_containers_are_left_alone_and_the_first_regular_container_is_converted() -> None:
    init = container("fetch-weights", limits={"cpu": "1"})
    pod = deployment_pod({"gpu-fraction": "0.25"}, initContainers=[init])
    _, patched = convert(pod)
    assert patched["spec"]["initContainers"] == [init]
    assert GPU_MEMORY in units_of(patched)["limits"]


def test_existing_requests_and_limits_are_kept_beside_the_new_resource() -> None:
    main = container(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "2Gi", "nvidia.com/gpu": 1})
    _, pod = convert(deployment_pod({"gpu-memory": "1024"}, containers=[main]))
    assert units_of(pod) == {
        "requests": {"cpu": "500m", "memory": "1Gi", GPU_MEMORY: "4"},
        "limits": {"memory": "2Gi", GPU_MEMORY: "4"},
    }


def test_required_expressions_are_anded_into_every_existing_term_and_preferred_terms_are_kept() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    pool = {"key": "pool", "operator": "In", "values": ["gpu"]}
    own_preference = {"weight": 1, "preference": {"matchExpressions": [pool]}}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [pool]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [own_preference],
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "trainer"}},
                    },
                }
            ]
        },
    }
    _, pod = convert(deployment_pod({"gpu-fraction": "0.5"}, affinity=copy.deepcopy(affinity)))
    units = int(units_of(pod)["limits"][GPU_MEMORY])
    steer_required, steer_preferred = steering.placement_affinity(
        steering.Request(
            units=units,
            units_per_gpu=CONTRACT.units_per_gpu(H200_MIB),
            largest_node_gpus=8,
            cpu_milli=pods.requests(pod["spec"])[0],
            cpu_per_gpu_milli=config.SteeringConfig().cpu_per_gpu_milli,
        ),
        CONTRACT,
    )
    terms = required_terms(pod)
    assert [t["matchExpressions"][0] for t in terms] == [zone, pool]
    for term in terms:
        assert pin(H200_MIB) in term["matchExpressions"]
        assert all(expression in term["matchExpressions"] for expression in steer_required)
    preferred = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [own_preference] + steer_preferred
    assert pod["spec"]["affinity"]["podAntiAffinity"] == affinity["podAntiAffinity"]


@pytest.mark.parametrize(
    ("annotations", "largest"),
    [({"gpu-fraction": "0.5"}, 8), ({"gpu-memory": "100000"}, 8), ({"gpu-memory": "2000"}, 8)],
    ids=["fraction-on-h200", "memory-only-h200-holds", "memory-any-class"],
)
def test_a_pod_smaller_than_the_largest_node_of_its_class_keeps_off_whole_free_such_nodes(
    annotations: dict[str, str], largest: int
) -> None:
    # The view's classes: 2 x H100 (the demo node) and 8 x H200; a share is pinned to H200 here.
    _, pod = convert(deployment_pod(annotations))
    keep_whole = {"key": CONTRACT.label_free_gpus, "operator": "Lt", "values": [str(largest)]}
    matching = [t for t in preferred_terms(pod) if t["preference"]["matchExpressions"] == [keep_whole]]
    assert [t["weight"] for t in matching] == [steering.WEIGHTS.keep_whole_node]


def test_without_cpu_pod_steering_whole_free_nodes_are_not_kept_for_the_largest_pods() -> None:
    settings = dataclasses.replace(SETTINGS, steering=dataclasses.replace(SETTINGS.steering, cpu_pods=False))
    _, pod = convert(deployment_pod({"gpu-fraction": "0.5"}), settings=settings)
    keep_whole = {"key": CONTRACT.label_free_gpus, "operator": "Lt", "values": ["8"]}
    assert all(t["preference"]["matchExpressions"] != [keep_whole] for t in preferred_terms(pod))


def test_with_steering_off_only_the_class_pin_is_added() -> None:
    settings = dataclasses.replace(SETTINGS, steering=config.SteeringConfig(enabled=False))
    _, pod = convert(deployment_pod({"gpu-fraction": "0.5"}), settings=settings)
    assert required_terms(pod) == [{"matchExpressions": [pin(H200_MIB)]}]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in pod["spec"]["affinity"]["nodeAffinity"]


def test_kai_scheduler_name_is_rewritten_to_the_default_scheduler_and_said_so() -> None:
    outcome, pod = convert(deployment_pod({"gpu-memory": "2000"}, schedulerName="kai-scheduler"))
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert decision(pod)["schedulerNameWas"] == "kai-scheduler"
    assert any("kai-scheduler" in warning for warning in outcome.warnings)


def test_a_configured_scheduler_name_is_set_on_converted_pods_only() -> None:
    settings = dataclasses.replace(SETTINGS, scheduler_name="gpuslice-binpack")
    _, pod = convert(deployment_pod({"gpu-memory": "2000"}), settings=settings)
    assert pod["spec"]["schedulerName"] == "gpuslice-binpack"
    plain = deployment_pod(containers=[container(limits={"cpu": "1"})])
    outcome = mutation.mutate(plain, settings=settings, cluster=make_view())
    assert outcome.kind == conversions.KIND_CPU_POD  # steered, but its scheduler is not changed
    assert [op["path"] for op in outcome.patch] == ["/spec/affinity"]


def test_whole_gpus_are_converted_when_asked_and_pinned_to_a_class_with_enough_gpus_per_node() -> None:
    settings = dataclasses.replace(SETTINGS, convert_whole_gpus=True)
    pod = deployment_pod(
        containers=[container(limits={"nvidia.com/gpu": "4"}), container("logger", limits={"cpu": "100m"})],
        initContainers=[container("warmup", limits={"nvidia.com/gpu": 1})],
    )
    outcome, patched = convert(pod, settings=settings)
    assert outcome.kind == conversions.KIND_WHOLE_GPUS
    assert units_of(patched)["limits"] == {GPU_MEMORY: str(4 * 561)}
    assert units_of(patched, 0, "initContainers")["limits"] == {GPU_MEMORY: "561"}
    assert units_of(patched, 1)["limits"] == {"cpu": "100m"}
    assert all(pin(H200_MIB) in term["matchExpressions"] for term in required_terms(patched))
    assert decision(patched)["gpus"] == 4


def test_whole_gpus_are_converted_by_default_and_left_alone_with_convert_whole_gpus_off() -> None:
    pod = deployment_pod(containers=[container(limits={"nvidia.com/gpu": "2"})])
    assert mutation.mutate(pod, settings=SETTINGS, cluster=make_view()).kind == conversions.KIND_WHOLE_GPUS
    off = dataclasses.replace(SETTINGS, convert_whole_gpus=False)
    assert mutation.mutate(pod, settings=off, cluster=make_view()) == mutation.Outcome(allowed=True)


def test_a_custom_prefix_and_unit_size_name_every_resource_and_annotation() -> None:
    settings = config.load(environ={}, overrides={"resourcePrefix": "gpus.example.com", "memoryUnitMiB": 1024})
    view = make_view(settings=settings)
    _, pod = convert(
        deployment_pod({"gpu-memory": "3000", "gpus.example.com/isolation": "mig"}), settings=settings, view=view
    )
    assert units_of(pod)["limits"] == {"gpus.example.com/mig-1g.10gb": "1"}
    assert "gpus.example.com/decision" in pod["metadata"]["annotations"]
    _, pod = convert(deployment_pod({"gpu-memory": "3000"}), settings=settings, view=view)
    assert units_of(pod)["limits"] == {"gpus.example.com/gpu-memory": "3"}


# --- the fast path and idempotency ---------------------------------------------------------


@pytest.mark.parametrize(
    "pod",
    [
        deployment_pod(containers=[container(limits={"cpu": "1"})]),
        deployment_pod({"team": "a"}, containers=[container()]),
        deployment_pod({"gpu-fraction-container-name": "main"}),
    ],
    ids=["no-annotations", "other-annotations", "container-name-only"],
)
def test_pods_without_gpu_annotations_are_allowed_without_a_patch(pod: dict[str, Any]) -> None:
    no_cpu_steering = dataclasses.replace(
        SETTINGS, steering=dataclasses.replace(SETTINGS.steering, cpu_pods=False), convert_whole_gpus=False
    )
    assert mutation.mutate(pod, settings=no_cpu_steering, cluster=make_view()) == mutation.Outcome(allowed=True)


@pytest.mark.parametrize(
    ("annotations", "settings"),
    [
        ({"gpu-fraction": "0.5"}, SETTINGS),
        ({"gpu-memory": "2000"}, dataclasses.replace(SETTINGS, scheduler_name="gpuslice-binpack")),
        ({"gpu-memory": "2000", "gpuslice.io/isolation": "mig"}, SETTINGS),
        ({}, dataclasses.replace(SETTINGS, convert_whole_gpus=True)),
    ],
    ids=["fraction", "memory-with-scheduler", "mig", "whole-gpus"],
)
def test_reinvocation_on_a_converted_pod_adds_nothing(annotations: dict[str, str], settings: config.Config) -> None:
    _, once = convert(deployment_pod(annotations or None), settings=settings)
    # Even after the cluster changed (another class now has the larger free share).
    again = mutation.mutate(once, settings=settings, cluster=make_view(h200_free_units=0))
    assert again.allowed and again.patch == []


def test_without_a_container_name_the_share_goes_to_the_container_with_the_placeholder() -> None:
    sidecar = container("sidecar", requests={"cpu": "100m"})
    pod = deployment_pod({"gpu-memory": "2000"}, containers=[sidecar, container(limits={"nvidia.com/gpu": "1"})])
    _, patched = convert(pod)
    assert patched["spec"]["containers"][0] == sidecar
    assert units_of(patched, 1)["limits"] == {GPU_MEMORY: "8"}


def test_a_placeholder_on_an_init_container_puts_the_share_there() -> None:
    pod = deployment_pod(
        {"gpu-fraction": "0.25"},
        initContainers=[container("warmup", limits={"nvidia.com/gpu": "1"})],
        containers=[container("serve", requests={"cpu": "1"})],
    )
    _, patched = convert(pod)
    init = patched["spec"]["initContainers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in init and int(init[GPU_MEMORY]) > 0
    assert GPU_MEMORY not in (patched["spec"]["containers"][0].get("resources") or {}).get("limits", {})


def test_reinvocation_after_another_webhook_put_a_sidecar_first_adds_nothing() -> None:
    _, once = convert(deployment_pod({"gpu-memory": "2000"}))
    once["spec"]["containers"].insert(0, container("sidecar", requests={"cpu": "100m"}))
    again = mutation.mutate(once, settings=SETTINGS, cluster=make_view())
    assert again.allowed and again.patch == []


def test_a_pod_that_already_carries_the_gpuslice_resource_is_not_converted_again() -> None:
    pod = deployment_pod({"gpu-fraction": "0.5"}, containers=[container(limits={GPU_MEMORY: "10"})])
    assert mutation.mutate(pod, settings=SETTINGS, cluster=make_view()) == mutation.Outcome(allowed=True)


# --- pods that ask for no device (steering.cpuPods) ------------------------------------------


def cpu_pod(**spec: Any) -> dict[str, Any]:
    return deployment_pod(**{"containers": [container(requests={"cpu": "8", "memory": "16Gi"})], **spec})


def preferred_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    node_affinity = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    return node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution", [])


def test_a_pod_that_asks_for_no_device_prefers_nodes_without_a_free_whole_gpu() -> None:
    outcome, pod = convert(cpu_pod())
    assert outcome.kind == conversions.KIND_CPU_POD and outcome.decision is None
    assert preferred_terms(pod) == steering.cpu_pod_preferences(CONTRACT)
    assert required_terms(pod) == []  # a preference only: the pod may still go anywhere
    assert "annotations" not in pod["metadata"] and pod["spec"]["containers"] == cpu_pod()["spec"]["containers"]


def test_with_a_nearly_full_bound_a_cpu_pod_gets_the_graded_preferences() -> None:
    always = dataclasses.replace(SETTINGS.steering, cpu_pods_nearly_full_cpu_percent=0)
    _, pod = convert(cpu_pod(), settings=dataclasses.replace(SETTINGS, steering=always))
    assert preferred_terms(pod) == steering.cpu_pod_preferences(CONTRACT, 8192)
    # Below 8 GiB, 4 GiB and 2 GiB of 256 MiB units, the fewer the better.
    for units, weight in zip(("32", "16", "8"), reversed(steering.WEIGHTS.cpu_pod_nearly_full), strict=True):
        below = {"key": CONTRACT.label_free_units, "operator": "Lt", "values": [units]}
        assert [t["weight"] for t in preferred_terms(pod) if below in t["preference"]["matchExpressions"]] == [weight]


def test_the_nearly_full_band_is_given_while_cpu_pods_ask_more_than_the_share_of_cpu_set() -> None:
    """Shipped: 8192 MiB while CPU-only pods ask more than 25 % of the CPU admitted."""
    view = make_view()
    graded, plain = steering.cpu_pod_preferences(CONTRACT, 8192), steering.cpu_pod_preferences(CONTRACT)
    assert preferred_terms(convert(cpu_pod(), view=view)[1]) == plain  # nothing counted yet
    for _ in range(cpudemand.MIN_PODS):  # 20 % of the CPU to CPU-only pods: 1 of 5 pods alike
        view.cpu_demand.note(8000, device=view.cpu_demand.pods % 5 != 0)
    assert preferred_terms(convert(cpu_pod(), view=view)[1]) == plain
    for _ in range(200):
        view.cpu_demand.note(8000, device=False)  # now about 40 %
    assert preferred_terms(convert(cpu_pod(), view=view)[1]) == graded
    off = dataclasses.replace(SETTINGS, steering=dataclasses.replace(SETTINGS.steering, cpu_pods_nearly_full_mib=0))
    assert preferred_terms(convert(cpu_pod(), settings=off, view=view)[1]) == plain


def test_a_steered_or_converted_pod_carries_the_cpu_it_asks() -> None:
    outcome, _ = convert(cpu_pod())
    assert outcome.pod_cpu_milli == 8000
    gpu = deployment_pod({"gpu-fraction": "0.5"}, containers=[container(requests={"cpu": "1500m"})])
    assert convert(gpu)[0].pod_cpu_milli == 1500


def test_a_cpu_pod_keeps_its_own_required_node_affinity() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [zone]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    _, pod = convert(cpu_pod(affinity=affinity))
    assert required_terms(pod) == [{"matchExpressions": [zone]}]
    assert preferred_terms(pod) == steering.cpu_pod_preferences(CONTRACT)


@pytest.mark.parametrize(
    "resources",
    [
        {"requests": {"cpu": "1", "ephemeral-storage": "1Gi"}},
        {"limits": {"memory": "1Gi", "hugepages-2Mi": "64Mi"}},
        {},
    ],
    ids=["ephemeral-storage", "hugepages", "no-resources"],
)
def test_cpu_memory_storage_and_hugepages_count_as_asking_for_no_device(resources: dict[str, Any]) -> None:
    outcome, _ = convert(deployment_pod(containers=[container(**resources)]))
    assert outcome.kind == conversions.KIND_CPU_POD


_OWN_PREFERENCE = {
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
        ]
    }
}


@pytest.mark.parametrize(
    ("pod", "settings"),
    [
        (
            deployment_pod(containers=[container(limits={"nvidia.com/gpu": "1"})]),
            dataclasses.replace(SETTINGS, convert_whole_gpus=False),
        ),
        (deployment_pod(containers=[container(limits={"amd.com/gpu": "1"})]), SETTINGS),
        (cpu_pod(initContainers=[container("load", limits={"example.com/fpga": "1"})]), SETTINGS),
        (deployment_pod({"gpu-fraction-container-name": "main"}, containers=[container()]), SETTINGS),
        (cpu_pod(nodeName="gpu-node-1"), SETTINGS),
        (cpu_pod(affinity=_OWN_PREFERENCE), SETTINGS),
        (cpu_pod(), dataclasses.replace(SETTINGS, steering=dataclasses.replace(SETTINGS.steering, enabled=False))),
        (cpu_pod(), dataclasses.replace(SETTINGS, steering=dataclasses.replace(SETTINGS.steering, cpu_pods=False))),
    ],
    ids=[
        "nvidia-gpu-not-converted",
        "other-vendor-device",
        "device-in-init-container",
        "gpu-annotation",
        "already-bound",
        "own-node-preferences",
        "steering-off",
        "cpu-pods-off",
    ],
)
def test_pods_that_are_not_plain_cpu_pods_or_not_to_be_steered_are_left_alone(
    pod: dict[str, Any], settings: config.Config
) -> None:
    assert mutation.mutate(pod, settings=settings, cluster=make_view()) == mutation.Outcome(allowed=True)


def test_daemonset_pods_and_pods_opted_out_by_label_are_left_alone() -> None:
    daemon = cpu_pod()
    daemon["metadata"]["ownerReferences"][0].update(kind="DaemonSet", name="node-exporter")
    opted_out = cpu_pod()
    opted_out["metadata"]["labels"][CONTRACT.label_pod_cpu_steering] = "off"
    for pod in (daemon, opted_out):
        assert mutation.mutate(pod, settings=SETTINGS, cluster=make_view()) == mutation.Outcome(allowed=True)


def test_reinvocation_on_a_steered_cpu_pod_adds_nothing() -> None:
    _, once = convert(cpu_pod())
    assert mutation.mutate(once, settings=SETTINGS, cluster=make_view()) == mutation.Outcome(allowed=True)


# --- tolerations of converted pods (issue 14) ------------------------------------------------

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_a_converted_pod_gets_the_gpu_toleration_beside_its_own() -> None:
    outcome, pod = convert(deployment_pod({"gpu-fraction": "0.5"}))
    assert pod["spec"]["tolerations"][0]["key"] == "node.kubernetes.io/not-ready"
    assert pod["spec"]["tolerations"][1:] == [GPU_TOLERATION]
    assert decision(pod)["tolerationsAdded"] == 1


def test_a_pod_without_tolerations_gets_a_list_with_the_gpu_toleration() -> None:
    bare = deployment_pod({"gpu-memory": "2000"})
    del bare["spec"]["tolerations"]
    _, pod = convert(bare)
    assert pod["spec"]["tolerations"] == [GPU_TOLERATION]


@pytest.mark.parametrize(
    "own",
    [
        GPU_TOLERATION,
        {"key": "nvidia.com/gpu", "operator": "Exists"},  # every effect
        {"operator": "Exists"},  # every taint
        {"operator": "Exists", "effect": "NoSchedule"},
    ],
    ids=["the-same", "key-any-effect", "everything", "any-key-noschedule"],
)
def test_a_pod_that_already_tolerates_the_gpu_taint_gets_no_second_toleration(own: dict[str, str]) -> None:
    pod = deployment_pod({"gpu-fraction": "0.5"})
    pod["spec"]["tolerations"] = [own]
    outcome, patched = convert(pod)
    assert patched["spec"]["tolerations"] == [own] and "tolerationsAdded" not in decision(patched)


@pytest.mark.parametrize(
    "own",
    [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
        {"key": "example.com/fpga", "operator": "Exists"},
    ],
    ids=["one-value-only", "other-effect", "other-key"],
)
def test_a_toleration_that_covers_less_does_not_count(own: dict[str, str]) -> None:
    pod = deployment_pod({"gpu-fraction": "0.5"})
    pod["spec"]["tolerations"] = [own]
    _, patched = convert(pod)
    assert patched["spec"]["tolerations"] == [own, GPU_TOLERATION]


def test_configured_tolerations_replace_the_default_and_an_empty_list_adds_none() -> None:
    wanted = (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},  # once only
    )
    settings = dataclasses.replace(SETTINGS, converted_pod_tolerations=wanted)
    _, pod = convert(deployment_pod({"gpu-memory": "20Gi"}), settings=settings)
    assert pod["spec"]["tolerations"][1:] == list(wanted[:2])
    settings = dataclasses.replace(SETTINGS, converted_pod_tolerations=())
    _, pod = convert(deployment_pod({"gpu-memory": "20Gi"}), settings=settings)
    assert len(pod["spec"]["tolerations"]) == 1


def test_whole_gpu_mig_and_dra_conversions_get_the_toleration_too() -> None:
    whole = dataclasses.replace(SETTINGS, convert_whole_gpus=True)
    dra = dataclasses.replace(SETTINGS, dra=dataclasses.replace(SETTINGS.dra, enabled=True))
    cases = [
        (deployment_pod(containers=[container(limits={"nvidia.com/gpu": "2"})]), whole),
        (deployment_pod({"gpu-memory": "9000", "gpuslice.io/isolation": "mig"}), SETTINGS),
        (deployment_pod({"gpu-fraction": "0.5"}), dra),
    ]
    for pod, settings in cases:
        outcome = mutation.mutate(pod, settings=settings, cluster=make_view())
        patched = jsonpatch.apply_patch(pod, outcome.patch)
        assert GPU_TOLERATION in patched["spec"]["tolerations"], outcome.kind


def test_pods_that_are_not_converted_get_no_toleration() -> None:
    plain = deployment_pod({"team": "a"}, containers=[container()])
    for pod in (deployment_pod({"gpu-fraction": "7"}), cpu_pod(), plain):
        outcome = mutation.mutate(pod, settings=SETTINGS, cluster=make_view())
        assert not any("tolerations" in op["path"] for op in outcome.patch)


# --- denials -------------------------------------------------------------------------------

DENIALS = [
    ("fraction-not-a-number", {"gpu-fraction": "half"}, ["gpu-fraction='half'", "not a number", "accepted"]),
    ("fraction-zero", {"gpu-fraction": "0"}, ["gpu-fraction='0'", "zero", "accepted"]),
    ("fraction-negative", {"gpu-fraction": "-0.5"}, ["gpu-fraction='-0.5'", "negative", "accepted"]),
    ("fraction-above-one", {"gpu-fraction": "1.5"}, ["gpu-fraction='1.5'", "above 1", "accepted"]),
    ("fraction-nan", {"gpu-fraction": "nan"}, ["gpu-fraction='nan'", "accepted"]),
    ("fraction-infinity", {"gpu-fraction": "inf"}, ["gpu-fraction='inf'", "not a number"]),
    ("fraction-padded", {"gpu-fraction": " 0.5 "}, ["gpu-fraction=' 0.5 '", "not a number"]),
    ("fraction-full-width-digits", {"gpu-fraction": "０.５"}, ["gpu-fraction='０.５'", "not a number"]),
    ("fraction-underscore", {"gpu-fraction": "0.2_5"}, ["gpu-fraction='0.2_5'", "not a number"]),
    ("fraction-huge", {"gpu-fraction": "9" * 400}, ["gpu-fraction='999", "(400 characters)", "too long"]),
    ("memory-309-digits", {"gpu-memory": "1" * 309}, ["gpu-memory='111", "(309 characters)", "accepted"]),
    ("memory-60-digits", {"gpu-memory": "1" * 60}, ["gpu-memory='111", "larger than any GPU"]),
    ("memory-huge-exponent", {"gpu-memory": "1e999999999"}, ["gpu-memory='1e999999999'", "larger than any GPU"]),
    ("memory-huge-quantity", {"gpu-memory": "9" * 50 + "Ei"}, ["gpu-memory='999", "larger than any GPU"]),
    ("memory-full-width-digits", {"gpu-memory": "１２００"}, ["gpu-memory='１２００'", "not a number"]),
    ("memory-underscore", {"gpu-memory": "1_000"}, ["gpu-memory='1_000'", "not a number"]),
    ("memory-padded", {"gpu-memory": " 1200 "}, ["gpu-memory=' 1200 '", "not a number"]),
    ("memory-nan", {"gpu-memory": "NaN"}, ["gpu-memory='NaN'", "not a number"]),
    ("memory-infinity", {"gpu-memory": "Infinity"}, ["gpu-memory='Infinity'", "not a number"]),
    ("memory-exponent-and-suffix", {"gpu-memory": "1e3Gi"}, ["gpu-memory='1e3Gi'", "not a number"]),
    ("memory-millibytes", {"gpu-memory": "500m"}, ["gpu-memory='500m'", "fraction of a byte"]),
    (
        "num-devices-superscript",
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "²"},
        ["gpu-fraction-num-devices='²'", "accepted"],
    ),
    (
        "num-devices-full-width",
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "２"},
        ["gpu-fraction-num-devices='２'", "accepted"],
    ),
    (
        "num-devices-zero",
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"},
        ["gpu-fraction-num-devices='0'", "positive integer"],
    ),
    (
        "long-container-name",
        {"gpu-memory": "2000", "gpu-fraction-container-name": "c" * 5000},
        ["gpu-fraction-container-name='ccc", "(5000 characters)"],
    ),
    ("memory-not-a-number", {"gpu-memory": "lots"}, ["gpu-memory='lots'", "not a number", "accepted"]),
    ("memory-zero", {"gpu-memory": "0"}, ["gpu-memory='0'", "zero", "accepted"]),
    ("memory-zero-quantity", {"gpu-memory": "0Gi"}, ["gpu-memory='0Gi'", "zero"]),
    ("memory-negative", {"gpu-memory": "-100"}, ["gpu-memory='-100'", "negative", "accepted"]),
    ("memory-larger-than-any-gpu", {"gpu-memory": "200000"}, ["gpu-memory", "200000 MiB", "larger than any known GPU"]),
    ("memory-a-whole-h200-and-a-bit", {"gpu-memory": "143771"}, ["gpu-memory", "larger than any known GPU"]),
    ("both", {"gpu-fraction": "0.5", "gpu-memory": "2000"}, ["gpu-fraction='0.5'", "gpu-memory='2000'", "exactly one"]),
    (
        "unknown-container",
        {"gpu-memory": "2000", "gpu-fraction-container-name": "trainer"},
        ["gpu-fraction-container-name='trainer'", "containers: main"],
    ),
    ("num-devices-without-share", {"gpu-fraction-num-devices": "2"}, ["gpu-fraction-num-devices='2'", "needs a share"]),
    (
        "num-devices",
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"},
        [
            "gpu-fraction-num-devices='2'",
            "not supported in device-plugin mode",
            "device IDs",
            "nvidia.com/gpu: N",
            "DRA mode",
        ],
    ),
    (
        "num-devices-not-a-number",
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "two"},
        ["'two'", "positive integer"],
    ),
    (
        "isolation-unknown",
        {"gpu-memory": "2000", "gpuslice.io/isolation": "strict"},
        ["gpuslice.io/isolation='strict'", "'mig'"],
    ),
    ("isolation-without-share", {"gpuslice.io/isolation": "mig"}, ["gpuslice.io/isolation='mig'", "needs a share"]),
    (
        "mig-too-large",
        {"gpu-memory": "50000", "gpuslice.io/isolation": "mig"},
        ["50000 MiB", "larger than any MIG profile", "3g.40gb"],
    ),
    (
        "mig-or-share-in-device-plugin-mode",
        {"gpu-memory": "9000", "gpuslice.io/isolation": "mig", "gpuslice.io/mig-or-share": "true"},
        ["gpuslice.io/mig-or-share='true'", "not supported in device-plugin mode", "else", "DRA mode"],
    ),
    (
        "mig-or-share-not-a-boolean",
        {"gpu-memory": "9000", "gpuslice.io/isolation": "mig", "gpuslice.io/mig-or-share": "1"},
        ["gpuslice.io/mig-or-share='1'", "not a boolean", '"true" or "false"'],
    ),
    (
        "mig-or-share-without-mig",
        {"gpu-memory": "9000", "gpuslice.io/mig-or-share": "true"},
        ["gpuslice.io/mig-or-share='true'", "needs gpuslice.io/isolation: mig"],
    ),
]


@pytest.mark.parametrize(("annotations", "words"), [d[1:] for d in DENIALS], ids=[d[0] for d in DENIALS])
def test_bad_annotations_are_denied_with_a_message_naming_them(annotations: dict[str, str], words: list[str]) -> None:
    outcome, _ = convert(deployment_pod(annotations))
    assert not outcome.allowed and outcome.patch == [] and outcome.kind == ""
    for word in words:
        assert word in outcome.message, f"{word!r} missing from {outcome.message!r}"


def test_denials_quote_at_most_about_a_hundred_characters_of_any_value() -> None:
    long = "7" * 100_000
    pods = [
        deployment_pod({"gpu-memory": long}),
        deployment_pod({"gpu-fraction": long}),
        deployment_pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": long}),
        deployment_pod({"gpu-memory": "2000", "gpuslice.io/isolation": long}),
        deployment_pod({"gpu-memory": "2000", "gpuslice.io/isolation": "mig", "gpuslice.io/mig-or-share": long}),
        deployment_pod({"gpu-memory": long, "gpu-fraction": long}),
        deployment_pod({"gpu-memory": "2000", "gpu-fraction-container-name": long}),
        deployment_pod({"gpu-fraction": "0.5"}, containers=[container(long, limits={"nvidia.com/gpu": long})]),
        deployment_pod({"gpu-fraction": "0.5"}, nodeSelector={"nvidia.com/gpu.product": long}),
        deployment_pod(containers=[container(long, limits={"nvidia.com/gpu": long})]),
    ]
    settings = dataclasses.replace(SETTINGS, convert_whole_gpus=True)
    for pod in pods:
        outcome = mutation.mutate(pod, settings=settings, cluster=make_view())
        assert not outcome.allowed and outcome.message
        assert len(outcome.message) < 1000, outcome.message[:300]


def test_whole_gpu_counts_in_other_digits_are_denied_not_failed() -> None:
    settings = dataclasses.replace(SETTINGS, convert_whole_gpus=True)
    for value in ("²", "２", " 2", "1_0", "2.0", "-1"):
        outcome, _ = convert(
            deployment_pod(containers=[container(limits={"nvidia.com/gpu": value})]), settings=settings
        )
        assert not outcome.allowed and "nvidia.com/gpu" in outcome.message and "whole number" in outcome.message


ANNOTATION_LIMIT = 256 * 1024


def annotation_bytes(pod: dict[str, Any]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in pod["metadata"]["annotations"].items())


@pytest.mark.parametrize("filler_bytes", [ANNOTATION_LIMIT - 100, ANNOTATION_LIMIT - 600, ANNOTATION_LIMIT - 3000])
def test_the_decision_annotation_never_pushes_a_pod_past_the_annotation_limit(filler_bytes: int) -> None:
    annotations = {"gpu-fraction": "0.5", "filler": ""}
    annotations["filler"] = "x" * (filler_bytes - annotation_bytes({"metadata": {"annotations": annotations}}))
    outcome, pod = convert(deployment_pod(annotations))
    assert outcome.allowed and GPU_MEMORY in units_of(pod)["limits"]
    assert annotation_bytes(pod) <= ANNOTATION_LIMIT
    if CONTRACT.decision_annotation not in pod["metadata"]["annotations"]:
        assert any("near the 256 KiB limit" in w for w in outcome.warnings)


def test_a_whole_gpu_count_next_to_a_share_is_denied() -> None:
    pod = deployment_pod({"gpu-fraction": "0.5"}, containers=[container(limits={"nvidia.com/gpu": "2"})])
    outcome, _ = convert(pod)
    assert not outcome.allowed and "nvidia.com/gpu: 2" in outcome.message and "placeholder" in outcome.message


def test_a_product_no_gpuslice_node_has_is_denied() -> None:
    pod = deployment_pod({"gpu-fraction": "0.5"}, nodeSelector={"nvidia.com/gpu.product": "Tesla-T4"})
    outcome, _ = convert(pod)
    assert not outcome.allowed and "Tesla-T4" in outcome.message and H100_PRODUCT in outcome.message


def test_mig_isolation_without_mig_in_the_cluster_is_denied() -> None:
    outcome, _ = convert(deployment_pod({"gpu-memory": "2000", "gpuslice.io/isolation": "mig"}), view=empty_view())
    assert not outcome.allowed and "no MIG profile" in outcome.message


def test_more_whole_gpus_than_any_node_has_are_denied() -> None:
    settings = dataclasses.replace(SETTINGS, convert_whole_gpus=True)
    outcome, _ = convert(deployment_pod(containers=[container(limits={"nvidia.com/gpu": "9"})]), settings=settings)
    assert not outcome.allowed and "9 GPUs" in outcome.message and "8" in outcome.message


def test_without_a_cluster_view_memory_above_the_default_gpu_is_denied() -> None:
    outcome, _ = convert(deployment_pod({"gpu-memory": "90000"}), view=empty_view())
    assert not outcome.allowed and "defaultGpuMemoryMiB" in outcome.message


# --- KAI's own example manifests -----------------------------------------------------------

KAI_MANIFESTS = """
apiVersion: v1
kind: Pod
metadata: {name: gpu-sharing-fraction, annotations: {gpu-fraction: "0.5"}}
spec:
  containers:
  - {name: my-container, image: your-image, resources: {limits: {nvidia.com/gpu: 1}}}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-sharing-memory, annotations: {gpu-memory: "2000"}}
spec:
  containers:
  - {name: my-container, image: your-image, resources: {limits: {nvidia.com/gpu: 1}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: gpu-workload
  labels: {kai.scheduler/queue: test}
  annotations: {gpu-memory: "2000"}
spec:
  schedulerName: kai-scheduler
  restartPolicy: Never
  containers:
  - {name: cuda-container, image: "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"}
  tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
"""


def _check_kai_manifest(pod: dict[str, Any]) -> None:
    outcome, patched = convert(pod)
    assert outcome.allowed, outcome.message
    limits = units_of(patched)["limits"]
    assert "nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in units_of(patched)["requests"]
    assert int(limits[GPU_MEMORY]) > 0
    assert patched["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
    assert patched["metadata"].get("labels") == pod["metadata"].get("labels")  # the queue label stays


@pytest.mark.parametrize("index", range(3), ids=["fraction", "memory", "kai-scheduler"])
def test_kai_example_manifests_are_accepted_unchanged(index: int) -> None:
    _check_kai_manifest(list(yaml.safe_load_all(KAI_MANIFESTS))[index])


def test_the_kai_examples_in_the_shared_reference_are_accepted() -> None:
    path = SHARED / "reference" / "kai-example-pods.yaml"
    if not path.exists():
        pytest.skip(f"{path} not present (the shared reference lives beside the checkout)")
    pods = [p for p in yaml.safe_load_all(path.read_text()) if p]
    assert len(pods) >= 3
    for pod in pods:
        _check_kai_manifest(pod)


def test_mig_isolation_for_a_product_only_mig_gpus_carry_takes_the_fraction_of_a_shared_class() -> None:
    pod = deployment_pod(
        {"gpu-fraction": "0.1", "gpuslice.io/isolation": "mig"},
        nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
    )
    outcome, patched = convert(pod)
    assert outcome.allowed, outcome.message
    assert units_of(patched)["limits"] == {CONTRACT.mig_resource("2g.20gb"): "1"}  # 0.1 x 143771 MiB > 9728
    assert patched["spec"]["nodeSelector"] == pod["spec"]["nodeSelector"]
