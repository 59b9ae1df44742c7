"""One node's labels read into the numbers the cluster view aggregates (webhook/nodelabels.py),
directly: honest labels as they are, labels no device plugin would write refused with their reason
code, and kubelet's own count of the resource bounding what the labels may say. What the view does
with a node it distrusts is checked in tests/webhook/test_cluster.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice import config
from gpuslice.webhook import nodelabels

CONTRACT = config.Config().contract
H100_MIB, PRODUCT = 81559, "NVIDIA-H100-80GB-HBM3"
PER_GPU = CONTRACT.units_per_gpu(H100_MIB)


def labels(gpus: int = 8, **counts: int) -> dict[str, str]:
    """An 8 x H100 node's labels, with free counts by contract property name (free_units=...)."""
    read = {
        CONTRACT.label_gpu_product: PRODUCT,
        CONTRACT.label_gpu_memory_mib: str(H100_MIB),
        CONTRACT.label_gpu_count: str(gpus),
    }
    return read | {getattr(CONTRACT, f"label_{name}"): str(value) for name, value in counts.items()}


def status(capacity: int, allocatable: int) -> dict[str, Any]:
    resource = CONTRACT.gpu_memory_resource
    return {
        "capacity": {"cpu": "64", resource: str(capacity)},
        "allocatable": {"cpu": "64", resource: str(allocatable)},
    }


def test_honest_labels_are_read_as_they_are() -> None:
    read = nodelabels.read(labels(free_units=1000, free_block_units=300, free_gpus=2, free_cpu_milli=4000), CONTRACT)
    assert read == nodelabels.NodeGpus(
        memory_mib=H100_MIB,
        product=PRODUCT,
        gpus=8,
        free_units=1000,
        mig_memory=(),
        free_block=300,
        free_gpus=2,
        free_cpu_milli=4000,
    )


def test_a_node_without_gpuslice_gpu_labels_reads_as_none() -> None:
    assert nodelabels.read({}, CONTRACT) is None
    assert nodelabels.read({"kubernetes.io/hostname": "cpu-1"}, CONTRACT) is None
    assert nodelabels.read(labels(gpus=0), CONTRACT) is None  # memory but no GPU: nothing to share


def test_without_free_counts_a_node_reads_as_empty() -> None:
    read = nodelabels.read(labels(), CONTRACT)
    assert read is not None and (read.free_units, read.free_block, read.free_gpus) == (8 * PER_GPU, PER_GPU, 8)


def test_free_counts_are_capped_at_what_the_gpus_hold() -> None:
    read = nodelabels.read(labels(free_units=8 * PER_GPU, free_block_units=PER_GPU + 5), CONTRACT)
    assert read is not None and read.free_block == PER_GPU


BAD = [
    ("20-digit-memory", {CONTRACT.label_gpu_memory_mib: "9" * 20}, nodelabels.MALFORMED),
    ("full-width-count", {CONTRACT.label_gpu_count: "８"}, nodelabels.MALFORMED),
    ("memory-below-1-gib", {CONTRACT.label_gpu_memory_mib: "512"}, nodelabels.MEMORY_OUT_OF_RANGE),
    ("mig-memory-above-1-tib", {CONTRACT.label_mig_memory("1g.10gb"): str(2**21)}, nodelabels.MEMORY_OUT_OF_RANGE),
    ("65-gpus", {CONTRACT.label_gpu_count: "65"}, nodelabels.COUNT_OUT_OF_RANGE),
    ("more-free-gpus-than-gpus", {CONTRACT.label_free_gpus: "9"}, nodelabels.FREE_ABOVE_TOTAL),
]


@pytest.mark.parametrize(("bad", "reason"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_labels_no_plugin_writes_are_distrusted_with_their_reason(bad: dict[str, str], reason: str) -> None:
    with pytest.raises(nodelabels.Distrusted) as caught:
        nodelabels.read(labels() | bad, CONTRACT)
    assert caught.value.reason == reason and str(caught.value)


def test_kubelets_count_of_the_resource_bounds_what_the_labels_may_say() -> None:
    units = 8 * PER_GPU
    assert nodelabels.read(labels(free_units=units), CONTRACT, status=status(units, units)) is not None
    with pytest.raises(nodelabels.Distrusted) as fewer:  # a larger GPU than kubelet counts units for
        nodelabels.read(labels(), CONTRACT, status=status(units - 1, units - 1))
    assert fewer.value.reason == nodelabels.CAPACITY_MISMATCH
    with pytest.raises(nodelabels.Distrusted) as above:
        nodelabels.read(labels(free_units=units + 1), CONTRACT, status=status(units, units))
    assert above.value.reason == nodelabels.FREE_ABOVE_TOTAL


def test_a_node_whose_plugin_is_down_keeps_its_gpus_with_nothing_free() -> None:
    read = nodelabels.read(labels(free_units=8 * PER_GPU, free_gpus=8), CONTRACT, status=status(8 * PER_GPU, 0))
    assert read is not None and read.plugin_down and read.gpus == 8
    assert (read.free_units, read.free_block, read.free_gpus) == (0, 0, 0)
