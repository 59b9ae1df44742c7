"""gpuslice.backoff: the retry delays every retrying loop shares."""

from __future__ import annotations

import math
import random

import pytest

from gpuslice import backoff


def test_delays_double_from_the_initial_one_up_to_the_cap() -> None:
    retry = backoff.Backoff(0.5, 3.0)
    assert [retry.next() for _ in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert retry.failures == 6


def test_reset_starts_again_from_the_initial_delay() -> None:
    retry = backoff.Backoff(1.0, 60.0)
    retry.next(), retry.next(), retry.next()
    retry.reset()
    assert retry.failures == 0
    assert retry.next() == 1.0


def test_the_factor_sets_the_growth() -> None:
    retry = backoff.Backoff(1.0, factor=3.0)
    assert [retry.next() for _ in range(3)] == [1.0, 3.0, 9.0]


def test_jitter_scales_each_delay_down_by_at_most_its_share() -> None:
    retry = backoff.Backoff(4.0, 4.0, jitter=0.5, rng=random.Random(7))
    delays = [retry.next() for _ in range(200)]
    assert all(2.0 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 100  # spread out, not a constant


def test_jittered_delays_repeat_with_the_same_seed() -> None:
    def run() -> list[float]:
        retry = backoff.Backoff(1.0, 60.0, jitter=0.5, rng=random.Random(3))
        return [retry.next() for _ in range(8)]

    assert run() == run()


def test_delay_of_an_attempt_does_not_count_a_failure() -> None:
    retry = backoff.Backoff(5.0)
    assert [retry.delay(a) for a in (0, 1, 4)] == [5.0, 10.0, 80.0]
    assert retry.failures == 0


def test_a_huge_attempt_count_gives_the_cap_not_an_overflow() -> None:
    assert backoff.Backoff(0.5, 30.0).delay(10_000) == 30.0
    assert backoff.Backoff(0.5).delay(10_000) == math.inf
    assert backoff.Backoff(0.0, 30.0).delay(10_000) == 0.0


def test_an_initial_delay_above_the_cap_gives_the_cap() -> None:
    assert backoff.Backoff(120.0, 60.0).next() == 60.0


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"initial": -1.0}, "must not be negative"),
        ({"initial": 1.0, "maximum": -1.0}, "must not be negative"),
        ({"initial": 1.0, "factor": 0.5}, "factor must be at least 1"),
        ({"initial": 1.0, "jitter": 1.5}, "jitter must be 0..1"),
    ],
    ids=["negative-initial", "negative-cap", "shrinking", "jitter-above-one"],
)
def test_bad_settings_are_refused_naming_the_problem(kwargs: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        backoff.Backoff(**kwargs)
