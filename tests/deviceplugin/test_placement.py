"""The memory-aware placement score (deviceplugin/placement.py): formula, smoothing, hysteresis,
capacity weighting, per-GPU read errors and memory pressure, driven by a settable reader and a
settable clock."""

from __future__ import annotations

import pytest

from gpuslice.deviceplugin import placement
from gpuslice.node import inventory


class Readings:
    """A settable NVML view: uuid -> (used MiB, total MiB, util %); a GPU may fail to read."""

    def __init__(self, **gpus: tuple[int, int, int | None]) -> None:
        self.gpus = dict(gpus)
        self.lost: set[str] = set()

    def __call__(self, uuid: str) -> tuple[int, int, int | None]:
        if uuid in self.lost:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return self.gpus[uuid]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(*sizes_mib: int, mig_too: bool = False) -> inventory.NodeInventory:
    gpus = [inventory.Gpu(uuid=f"G{i}", model="GPU", memory_mib=m, index=i) for i, m in enumerate(sizes_mib)]
    if mig_too:
        gpus.append(
            inventory.Gpu(
                uuid="M",
                model="GPU",
                memory_mib=81920,
                index=len(gpus),
                mig_enabled=True,
            )
        )
    return inventory.NodeInventory(gpus=tuple(gpus))


@pytest.mark.parametrize(
    ("used", "total", "util", "expected"),
    [
        (0, 80000, 0, 1.0),
        (40000, 80000, 0, 0.5),
        (40000, 80000, 50, 0.25),
        (80000, 80000, 0, 0.0),
        (0, 80000, 100, 0.0),
        (20000, 80000, None, 0.75),  # utilisation unknown (MIG): memory alone
        (90000, 80000, 0, 0.0),  # NVML over-reporting never goes negative
    ],
    ids=[
        "idle",
        "half memory",
        "half memory half busy",
        "memory full",
        "fully busy",
        "no utilisation",
        "clamped",
    ],
)
def test_a_gpus_score_is_free_memory_times_idle_time(used, total, util, expected):
    assert placement.gpu_score(used, total, util) == pytest.approx(expected)


def test_a_gpu_without_memory_is_a_clear_error():
    with pytest.raises(ValueError, match="total memory"):
        placement.gpu_score(0, 0, 0)


def test_the_node_score_is_the_capacity_weighted_mean_over_shared_gpus():
    readings = Readings(G0=(0, 80000, 0), G1=(40000, 40000, 0))
    score = placement.PlacementScore(node=node(80000, 40000, mig_too=True), read=readings, clock=Clock())
    assert score() == 70  # (80000 * 1 + 40000 * 0) / 120000 = 66.7 -> step 10
    assert score.raw() == pytest.approx(66.67, abs=0.01)


def test_one_spike_does_not_move_the_label_but_a_lasting_change_does():
    readings = Readings(G0=(8000, 80000, 0))
    clock = Clock()
    score = placement.PlacementScore(node=node(80000), read=readings, clock=clock, tau_seconds=60, step=10)
    assert score() == 90
    readings.gpus["G0"] = (8000, 80000, 100)  # one 5-second spike at 100% busy
    clock.now += 5
    assert score() == 90
    readings.gpus["G0"] = (8000, 80000, 0)
    for _ in range(12):  # back to idle: the label never moved
        clock.now += 5
        assert score() == 90
    readings.gpus["G0"] = (72000, 80000, 80)  # real, lasting pressure
    seen = []
    for _ in range(120):  # ten minutes, ten time constants
        clock.now += 5
        seen.append(score())
    assert seen[-1] == 0
    assert seen == sorted(seen, reverse=True)  # it falls, it does not flap


def test_the_published_value_has_hysteresis_around_a_step_boundary():
    readings = Readings(G0=(0, 100000, 0))
    clock = Clock()
    score = placement.PlacementScore(node=node(100000), read=readings, clock=clock, tau_seconds=1e-6)
    readings.gpus["G0"] = (45000, 100000, 0)  # raw 55: half way between 50 and 60
    clock.now += 1
    first = score()
    for used in (44000, 46000, 44500, 45500, 44000):  # noise around 55
        readings.gpus["G0"] = (used, 100000, 0)
        clock.now += 1
        assert score() == first
    assert first in (50, 60)


def test_a_gpu_that_cannot_be_read_keeps_its_last_reading_and_the_others_count():
    readings = Readings(G0=(0, 80000, 0), G1=(80000, 80000, 0))
    clock = Clock()
    score = placement.PlacementScore(node=node(80000, 80000), read=readings, clock=clock)
    assert score() == 50
    readings.lost.add("G1")
    clock.now += 5
    assert score() == 50


def test_no_readable_gpu_means_no_score():
    readings = Readings(G0=(0, 80000, 0))
    readings.lost.add("G0")
    score = placement.PlacementScore(node=node(80000), read=readings, clock=Clock())
    assert score() is None


@pytest.mark.parametrize(("tau", "step"), [(0, 10), (60, 0), (60, 101)])
def test_bad_smoothing_settings_are_refused(tau, step):
    with pytest.raises(ValueError, match="tau_seconds"):
        placement.PlacementScore(node=node(80000), read=Readings(), tau_seconds=tau, step=step)


def test_a_gpu_under_memory_pressure_scores_zero_and_lowers_the_node_score():
    gpus = tuple(inventory.Gpu(uuid=f"G{i}", model="GPU", memory_mib=80000, index=i) for i in range(2))
    pressured: set[str] = set()
    score = placement.PlacementScore(
        node=inventory.NodeInventory(gpus=gpus),
        read=lambda uuid: (0, 80000, 0),  # both GPUs free and idle
        pressured=lambda: pressured,
    )
    assert score() == 100
    pressured.add("G1")
    fresh = placement.PlacementScore(
        node=inventory.NodeInventory(gpus=gpus), read=lambda uuid: (0, 80000, 0), pressured=lambda: pressured
    )
    assert fresh() == 50  # G1 counts as full: (1 + 0) / 2
