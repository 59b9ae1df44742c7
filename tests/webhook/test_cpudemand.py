"""The CPU asked by pods that ask for no device, as a share of the CPU admitted (webhook/cpudemand.py)."""

from __future__ import annotations

import pytest

from gpuslice.webhook import cpudemand


def fed(pattern: list[tuple[int, bool]], times: int) -> cpudemand.CpuDemand:
    demand = cpudemand.CpuDemand()
    for _ in range(times):
        for cpu, device in pattern:
            demand.note(cpu, device=device)
    return demand


def test_the_share_is_not_read_before_enough_pods_were_counted() -> None:
    demand = fed([(4000, False)], cpudemand.MIN_PODS - 1)
    assert demand.share is None and not demand.above(25)
    assert demand.above(0)  # 0: always
    demand.note(4000, device=False)
    assert demand.share == pytest.approx(1.0) and demand.above(25)


def test_the_share_weighs_pods_by_the_cpu_they_ask() -> None:
    # One CPU-only pod of 6 cores for every GPU pod of 2: 75 % of the CPU, 50 % of the pods.
    demand = fed([(6000, False), (2000, True)], cpudemand.MIN_PODS)
    assert demand.share == pytest.approx(0.75, abs=1e-3)  # the older pods weigh a little less
    assert demand.above(74) and not demand.above(76)


def test_the_share_follows_the_recent_pods() -> None:
    demand = fed([(4000, False)], cpudemand.MIN_PODS)
    for _ in range(3 * cpudemand.WINDOW_PODS):  # the work changes: only GPU pods now
        demand.note(4000, device=True)
    assert demand.share is not None and demand.share < 0.01


def test_pods_that_ask_for_no_cpu_are_counted_but_move_nothing() -> None:
    demand = fed([(0, False)], cpudemand.MIN_PODS)
    assert demand.share is None  # no CPU asked at all: no share
    demand.note(-5, device=False)  # nothing below zero is counted
    assert demand.asked == (0.0, 0.0)
    demand.note(1000, device=True)
    assert demand.share == 0.0
