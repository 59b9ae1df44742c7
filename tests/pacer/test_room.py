"""Whether pods that could land on one node fit there together in any order (pacer/room.py)."""

from __future__ import annotations

import pytest

from gpuslice import contract as contract_
from gpuslice.pacer import room

CONTRACT = contract_.Contract()
UNITS = CONTRACT.gpu_memory_resource
MIG = CONTRACT.mig_resource("1g.10gb")
ALLOCATABLE = {UNITS: 2544, MIG: 2}  # 8 GPUs of 318 units


def labels(free_gpus: int, mig_free: int = 2, gpu_count: str = "8", block: int = 0) -> dict[str, str]:
    return {
        CONTRACT.label_gpu_count: gpu_count,
        CONTRACT.label_free_gpus: str(free_gpus),
        CONTRACT.label_free_block_units: str(318 if free_gpus else block),  # the largest free block
        CONTRACT.label_mig_free("1g.10gb"): str(mig_free),
    }


@pytest.mark.parametrize(
    ("demand", "touched"),
    [
        ({UNITS: 1}, {room.GPUS: 1}),  # a share: one GPU
        ({UNITS: 318}, {room.GPUS: 1}),  # a whole GPU
        ({UNITS: 636}, {room.GPUS: 2}),  # two whole GPUs
        ({UNITS: 319}, {room.GPUS: 2}),  # more than one GPU holds (kubelet would refuse it anyway)
        ({MIG: 1}, {MIG: 1}),
    ],
)
def test_a_pod_touches_one_gpu_per_share_and_its_whole_gpus(demand, touched):
    assert room.touches(demand, ALLOCATABLE, labels(8), CONTRACT) == touched


def test_without_a_gpu_count_a_pod_is_taken_to_touch_one_gpu():
    assert room.touches({UNITS: 636}, ALLOCATABLE, labels(8, gpu_count=""), CONTRACT) == {room.GPUS: 1}


@pytest.mark.parametrize(
    ("demands", "free_gpus", "fit"),
    [
        ([{UNITS: 100}, {UNITS: 100}], 2, True),  # each can have a free GPU of its own
        ([{UNITS: 200}, {UNITS: 200}, {UNITS: 200}], 2, False),  # a third could find none
        ([{UNITS: 636}, {UNITS: 1}], 3, True),
        ([{UNITS: 636}, {UNITS: 1}], 2, False),
        ([{UNITS: 1}], 0, False),  # no free GPU nor block: only a lone pod goes, by its affinity (the caller's rule)
        ([{UNITS: 100}, {UNITS: 100}, {UNITS: 100}], 1, True),  # 300 units fit in the free GPU's 318 together
        ([{UNITS: 100}, {UNITS: 100}, {UNITS: 200}], 1, False),
        ([{MIG: 1}, {MIG: 1}], 0, True),  # MIG devices count against their own free label
        ([{MIG: 1}, {MIG: 1}, {MIG: 1}], 8, False),
    ],
)
def test_pods_fit_together_while_the_labels_show_enough_free_gpus_and_mig_devices(demands, free_gpus, fit):
    assert room.fit_together(demands, ALLOCATABLE, labels(free_gpus), CONTRACT) is fit


@pytest.mark.parametrize(
    ("demands", "block", "fit"),
    [
        ([{UNITS: 100}, {UNITS: 100}], 250, True),  # every GPU in use, but one has room for both
        ([{UNITS: 100}, {UNITS: 200}], 250, False),
        ([{UNITS: 318}, {UNITS: 1}], 318, False),
        ([{UNITS: 636}], 636, False),  # two GPUs' worth: a block is one GPU, whatever the label says
    ],
)
def test_shares_fit_together_in_the_largest_free_block(demands, block, fit):
    assert room.fit_together(demands, ALLOCATABLE, labels(0, block=block), CONTRACT) is fit
