"""The webhook's cluster view: GPU classes and MIG profiles from the labels the device plugin publishes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from clusterkit import CONTRACT, gpu_labels, view

from gpuslice import config
from gpuslice.node import inventory
from gpuslice.node import labels as node_labels
from gpuslice.webhook import cluster, mutation, nodelabels


def test_an_empty_view_is_not_known_and_has_no_classes() -> None:
    empty = view()
    assert not empty.known and empty.classes() == [] and empty.mig_profiles() == {}


def test_classes_and_mig_profiles_come_from_the_device_plugins_labels(
    demo_node: inventory.NodeInventory, h200_node: inventory.NodeInventory
) -> None:
    cv = view()
    cv.update_node("demo", node_labels.node_labels(demo_node, CONTRACT, allocated={demo_node.memory_gpus[0].uuid: 18}))
    cv.update_node("h200", node_labels.node_labels(h200_node, CONTRACT))
    assert cv.known
    assert cv.classes() == [
        cluster.GpuClass(
            81559, frozenset({"NVIDIA-H100-80GB-HBM3"}), gpus=2, free_units=2 * 318 - 18, nodes=1, max_gpus_per_node=2
        ),
        cluster.GpuClass(143771, frozenset({"NVIDIA-H200"}), gpus=8, free_units=8 * 561, nodes=1, max_gpus_per_node=8),
    ]
    assert cv.mig_profiles() == {"1g.10gb": 9728, "2g.20gb": 19968, "3g.40gb": 40192}


def test_products_with_the_same_memory_share_one_class_and_leave_it_with_their_last_node() -> None:
    cv = view()
    cv.update_node("a", gpu_labels(81920, 8, "NVIDIA-A100-SXM4-80GB"))
    cv.update_node("b", gpu_labels(81920, 4, "NVIDIA-H100-PCIe"))
    (only,) = cv.classes()
    assert only.products == {"NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-PCIe"}
    assert (only.gpus, only.nodes, only.max_gpus_per_node) == (12, 2, 8)
    cv.remove_node("a")
    (only,) = cv.classes()
    assert only.products == {"NVIDIA-H100-PCIe"} and only.max_gpus_per_node == 4 and only.gpus == 4


def test_a_changed_node_replaces_its_old_contribution() -> None:
    cv = view()
    cv.update_node("a", gpu_labels(81920, 2, free_units=640))
    cv.update_node("a", gpu_labels(81920, 2, free_units=10))
    assert cv.classes()[0].free_units == 10 and cv.classes()[0].nodes == 1
    cv.update_node("a", gpu_labels(40960, 2))
    assert [c.memory_mib for c in cv.classes()] == [40960]


def test_a_node_that_loses_its_gpu_labels_is_dropped_and_unknown_removals_are_ignored() -> None:
    cv = view()
    cv.update_node("a", gpu_labels(81920, 2))
    cv.update_node("a", {"kubernetes.io/hostname": "a"})
    cv.remove_node("never-seen")
    assert not cv.known and cv.classes() == []


def test_without_steering_labels_a_node_counts_as_empty_and_bad_values_are_clamped_or_ignored() -> None:
    cv = view()
    cv.update_node("no-steering", gpu_labels(81920, 2))
    cv.update_node("too-many", gpu_labels(81920, 1, free_units=99999))
    cv.update_node("garbage", {CONTRACT.label_gpu_memory_mib: "eighty", CONTRACT.label_gpu_count: "2"})
    cv.update_node("bad-mig", {CONTRACT.label_mig_memory("1g.10gb"): "lots"})
    (only,) = cv.classes()
    assert only.free_units == 3 * 320 and only.nodes == 2
    assert cv.mig_profiles() == {}


def test_a_mig_only_node_makes_the_view_known_without_a_memory_class() -> None:
    cv = view()
    cv.update_node("mig", {CONTRACT.label_mig_memory("1g.10gb"): "9728", CONTRACT.label_mig_free("1g.10gb"): "7"})
    assert cv.known and cv.classes() == [] and cv.mig_profiles() == {"1g.10gb": 9728}
    cv.remove_node("mig")
    assert cv.mig_profiles() == {}


def test_running_aggregates_match_a_recount_after_many_random_changes() -> None:
    rng = random.Random(7)
    cv = view()
    current: dict[str, dict[str, str]] = {}
    for _ in range(3000):
        name = f"n{rng.randrange(40)}"
        if rng.random() < 0.2:
            cv.remove_node(name)
            current.pop(name, None)
            continue
        memory, gpus = rng.choice([(24576, 4), (81920, 8), (81920, 4), (143771, 8)])
        labels = gpu_labels(memory, gpus, rng.choice(["P1", "P2"]), rng.randrange(0, gpus * (memory // 256) + 1))
        if rng.random() < 0.3:
            labels[CONTRACT.label_mig_memory(rng.choice(["1g.10gb", "2g.20gb"]))] = "9728"
        cv.update_node(name, labels)
        current[name] = labels
    recount = view()
    for name, labels in current.items():
        recount.update_node(name, labels)
    assert cv.classes() == recount.classes()
    assert cv.mig_profiles() == recount.mig_profiles()
    assert cv.node_names() == set(current)


def test_what_is_derived_from_the_nodes_is_built_once_per_version() -> None:
    cv = view()
    cv.update_node("a", gpu_labels(81920, 8, "P", free_units=100))
    builds: list[int] = []

    def build() -> int:
        builds.append(len(cv.classes()))
        return len(builds)

    assert cv.derived("k", build) == cv.derived("k", build) == 1
    cv.update_node("a", gpu_labels(81920, 8, "P", free_units=100))  # no change: same version
    assert cv.derived("k", build) == 1
    cv.update_node("b", gpu_labels(24576, 4, "Q", free_units=10))
    assert cv.derived("k", build) == 2 and builds == [1, 2]
    cv.remove_node("b")
    assert cv.derived("k", build) == 3


# --- untrusted labels ----------------------------------------------------------------------

H100_UNITS = 81559 // 256  # what the plugin advertises per H100


def status(units: int, allocatable: int | None = None) -> dict[str, Any]:
    """A node's status as kubelet reports it, with the plugin's gpuslice memory resource."""
    resource = CONTRACT.gpu_memory_resource
    alloc = {"cpu": "64"} | (
        {} if allocatable == -1 else {resource: str(units if allocatable is None else allocatable)}
    )
    return {"capacity": {"cpu": "64", resource: str(units)}, "allocatable": alloc}


def steady_view() -> cluster.ClusterView:
    """One honest node of 8 H100s, a quarter used."""
    cv = view()
    labels = gpu_labels(81559, 8, "NVIDIA-H100-80GB-HBM3", free_units=6 * H100_UNITS)
    labels[CONTRACT.label_free_gpus] = "6"
    cv.update_node("honest", labels, status=status(8 * H100_UNITS))
    return cv


def fraction_pin(cv: cluster.ClusterView) -> int:
    pod = {
        "metadata": {"annotations": {"gpu-fraction": "0.5"}},
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }
    outcome = mutation.mutate(pod, settings=config.Config(), cluster=cv)
    assert outcome.allowed, outcome.message
    return int(outcome.decision["classMemoryMiB"])  # type: ignore[index]


BAD_LABELS = [
    ("20-digit-memory", {CONTRACT.label_gpu_memory_mib: "9" * 20}, nodelabels.MALFORMED),
    ("full-width-memory", {CONTRACT.label_gpu_memory_mib: "８１５５９"}, nodelabels.MALFORMED),
    ("padded-count", {CONTRACT.label_gpu_count: " 8"}, nodelabels.MALFORMED),
    ("underscore-free", {CONTRACT.label_free_units: "1_000"}, nodelabels.MALFORMED),
    ("memory-below-1-gib", {CONTRACT.label_gpu_memory_mib: "512"}, nodelabels.MEMORY_OUT_OF_RANGE),
    ("memory-above-1-tib", {CONTRACT.label_gpu_memory_mib: str(2 * 1024 * 1024)}, nodelabels.MEMORY_OUT_OF_RANGE),
    ("huge-mig-memory", {CONTRACT.label_mig_memory("1g.10gb"): "99999999999"}, nodelabels.MEMORY_OUT_OF_RANGE),
    ("thousand-gpus", {CONTRACT.label_gpu_count: "1000"}, nodelabels.COUNT_OUT_OF_RANGE),
    ("more-free-gpus-than-gpus", {CONTRACT.label_free_gpus: "9"}, nodelabels.FREE_ABOVE_TOTAL),
]


@pytest.mark.parametrize(("bad", "reason"), [b[1:] for b in BAD_LABELS], ids=[b[0] for b in BAD_LABELS])
def test_one_nodes_bad_labels_leave_out_that_node_only(bad: dict[str, str], reason: str) -> None:
    cv = steady_view()
    labels = {**gpu_labels(143771, 8, "NVIDIA-H200", free_units=8 * 561), CONTRACT.label_free_gpus: "8", **bad}
    cv.update_node("bad", labels)  # no exception
    assert [c.memory_mib for c in cv.classes()] == [81559] and cv.untrusted["bad"][0] == reason
    assert fraction_pin(cv) == 81559  # admissions go on, to the honest node's class
    cv.update_node("bad", gpu_labels(143771, 8, "NVIDIA-H200"))  # fixed labels: back in
    assert "bad" not in cv.untrusted and [c.memory_mib for c in cv.classes()] == [81559, 143771]


def test_a_forged_large_class_that_kubelet_does_not_count_attracts_nothing() -> None:
    cv = steady_view()
    # A 192 GiB "H100" with 8 free GPUs, on a node whose kubelet counts 8 real H100s of units.
    forged = gpu_labels(196608, 8, "NVIDIA-H100-80GB-HBM3", free_units=8 * 768)
    forged[CONTRACT.label_free_gpus] = "8"
    cv.update_node("forger", forged, status=status(8 * H100_UNITS))
    assert cv.untrusted["forger"][0] == nodelabels.CAPACITY_MISMATCH and "forger" not in {
        n for n in cv.node_names() if n not in cv.untrusted
    }
    assert [c.memory_mib for c in cv.classes()] == [81559] and fraction_pin(cv) == 81559


def test_free_units_above_what_kubelet_counts_leave_the_node_out() -> None:
    cv = view()
    labels = gpu_labels(81559, 2, "H100", free_units=3 * H100_UNITS)
    cv.update_node("n", labels, status=status(2 * H100_UNITS))
    assert cv.untrusted["n"][0] == nodelabels.FREE_ABOVE_TOTAL and cv.classes() == []


@pytest.mark.parametrize("allocatable", [0, -1], ids=["allocatable-zero", "resource-gone"])
def test_a_node_whose_plugin_is_down_keeps_its_class_but_steering_ignores_it(allocatable: int) -> None:
    cv = steady_view()
    dead = {**gpu_labels(143771, 8, "NVIDIA-H200", free_units=8 * 561), CONTRACT.label_free_gpus: "8"}
    cv.update_node("dead", dead, status=status(8 * 561, allocatable=allocatable))
    assert cv.untrusted["dead"][0] == nodelabels.PLUGIN_DOWN
    h200 = [c for c in cv.classes() if c.memory_mib == 143771][0]
    assert h200.free_units == 0 and h200.gpus == 8
    assert fraction_pin(cv) == 81559  # without the dead node, the fully free H200s would win
    cv.update_node("dead", dead, status=status(8 * 561))  # the plugin is back
    assert "dead" not in cv.untrusted and fraction_pin(cv) == 143771


def test_honest_labels_with_kubelets_counts_are_used_as_they_are() -> None:
    cv = steady_view()
    assert not cv.untrusted
    (only,) = cv.classes()
    assert only.free_units == 6 * H100_UNITS and only.gpus == 8


def test_the_shape_generation_moves_with_the_classes_and_the_pacer_not_with_free_capacity() -> None:
    cv = view()
    empty = cv.inputs.shape_generation
    cv.update_node("a", gpu_labels(81920, 8, "P", free_units=100))
    first = cv.inputs.shape_generation
    assert first != empty
    cv.update_node("a", gpu_labels(81920, 8, "P", free_units=50))  # an allocation
    assert cv.inputs.shape_generation == first and cv.generation != first
    for change in (
        lambda: cv.update_node("b", gpu_labels(24576, 4, "Q", free_units=0)),  # a new class
        lambda: cv.update_node("b", gpu_labels(24576, 4, "R", free_units=0)),  # another product
        lambda: cv.update_node("c", gpu_labels(81920, 4, "P", free_units=0)),  # more GPUs, other GPUs per node
        lambda: cv.set_pacer(""),
        lambda: cv.remove_node("c"),
    ):
        before = cv.inputs.shape_generation
        change()
        assert cv.inputs.shape_generation != before
    assert view().inputs.shape_generation != cv.inputs.shape_generation  # unique across views
