"""The Python model beside a replay on the real control plane (sim/kube_replay.py): the paced model's
feed from the run's moments, and the median of its draws. The replay itself runs in
tests/e2e/test_real_replay.py; its command line, arrivals, components and outcomes have test files
of their own (test_kube_cli.py, test_kube_arrivals.py, ...)."""

from __future__ import annotations

import pytest

from gpuslice import config
from gpuslice.sim import kube_replay, replay, trace


def test_the_paced_model_converts_in_the_order_the_pods_were_stored_and_schedules_in_the_order_decided() -> None:
    # Creates answered out of order (pod 0 stored first, answered last); pod 3 denied (no version).
    feed = kube_replay.model_feed(
        decided_at=[5.0, 4.0, 6.0, 0.3],
        answered_at=[0.9, 0.1, 0.5, 0.2],
        stored=[101, 105, 103, None],
    )
    # The answer times of the stored pods, 0.1 < 0.5 < 0.9, go to them in storage order 0, 2, 1.
    assert feed.converted_at == (0.1, 0.9, 0.5, 0.2)
    assert feed.scheduled_at == (5.0, 4.0, 6.0, 0.3)
    assert feed.order == (3, 1, 0, 2)
    # Ties keep the arrival order.
    assert kube_replay.model_feed([1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1, 2, 3]).order == (2, 0, 1)


def test_the_paced_models_feed_needs_one_moment_of_each_kind_per_arrival() -> None:
    with pytest.raises(ValueError, match="per arrival"):
        kube_replay.model_feed([1.0], [0.5, 0.6], [1, 2])


def _paced_case() -> tuple[list[trace.TraceNode], list[trace.TracePod], replay.Configuration, kube_replay.ModelFeed]:
    nodes = [trace.TraceNode(f"n{i}", 32000, 131072, 2, model) for i, model in enumerate(["V100M16", "V100M32"] * 3)]
    pods = [trace.TracePod(f"p{i}", 2000, 4096, 1, milli) for i, milli in enumerate([300, 700, 450, 250, 600] * 6)]
    configuration = replay.configurations(config.Config())["gpuslice-default"]
    # A burst: every create answered in the first second, the scheduler deciding them later.
    feed = kube_replay.model_feed(
        [1.0 + 0.1 * i for i in range(len(pods))], [0.03 * i for i in range(len(pods))], list(range(len(pods)))
    )
    return nodes, pods, configuration, feed


def test_the_paced_model_of_a_burst_is_the_median_of_its_draws_and_the_first_is_the_runs_own_order() -> None:
    nodes, pods, configuration, feed = _paced_case()
    median, ratios = kube_replay.paced_model(nodes, pods, configuration, feed, seed=7, draws=5)
    assert len(ratios) == 5
    assert median.gpu_allocation_ratio == sorted(ratios)[2]
    own = replay.replay(
        nodes,
        pods,
        configuration,
        seed=7,
        label_delay=replay.LabelDelay(
            min_interval_seconds=configuration.settings.steering.label_min_interval_seconds,
            scheduled_at=feed.scheduled_at,
            converted_at=feed.converted_at,
        ),
    )
    assert ratios[0] == own.gpu_allocation_ratio
    # The same seed draws the same orders.
    assert kube_replay.paced_model(nodes, pods, configuration, feed, seed=7, draws=5)[1] == ratios


def test_the_paced_model_needs_a_draw() -> None:
    nodes, pods, configuration, feed = _paced_case()
    with pytest.raises(ValueError, match="at least one draw"):
        kube_replay.paced_model(nodes, pods, configuration, feed, seed=7, draws=0)
