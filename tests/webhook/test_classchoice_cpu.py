"""In DRA mode a share that asks CPU goes first to a GPU class whose free GPUs have that CPU per
GPU (webhook/classchoice.py): else it takes CPU that its node's other GPUs need, and they stay
idle. Device-plugin mode keeps the largest free share. The views are test_admission's: 2 x H100
on a node with 200 unrequested cores (100 per free GPU) and 8 x H200 on one with
`h200_cpu_milli` (24 cores: 3 per free GPU). The rule holds while the scheduler is behind the
admissions (more than BEHIND_PODS converted pods wait for it) or no watch says how many wait."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from test_admission import SETTINGS, cpu_bound_view, half_gpu_pod, review

from gpuslice import config
from gpuslice.node import labels as node_labels
from gpuslice.node import nodefile
from gpuslice.webhook import admission, classchoice, cluster

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "gpuslice" / "examples"
H100, H200 = 81559, 143771
DRA = dataclasses.replace(SETTINGS, dra=dataclasses.replace(SETTINGS.dra, enabled=True))


def decisions(view: cluster.ClusterView, pods: int, pod: dict[str, Any], settings: config.Config = DRA) -> list[Any]:
    """The decision annotation of each of `pods` admissions of `pod`."""
    made = []
    for _ in range(pods):
        result = admission.review(json.dumps(review(pod)).encode(), settings=settings, cluster=view)
        assert result.outcome is not None and result.outcome.decision is not None
        made.append(result.outcome.decision)
    return made


def classes_of_a_burst(view: cluster.ClusterView, pods: int, pod: dict[str, Any]) -> list[int]:
    return [d["classMemoryMiB"] for d in decisions(view, pods, pod)]


def rule_of_next(view: cluster.ClusterView, pod: dict[str, Any]) -> str:
    return str(decisions(view, 1, pod)[0]["rule"])


LARGEST_SHARE = "largest free share on nodes where the pod fits now"
RICH = "largest free share where the free GPUs have the CPU it asks per GPU"


def test_a_share_asking_more_cpu_per_gpu_than_the_larger_class_has_goes_where_the_free_gpus_have_it() -> None:
    view = cpu_bound_view(h200_cpu_milli=24_000)
    # Half a GPU and 8 cores: 16 cores per GPU. The H200s have the larger free share (16 halves
    # against 4) but 3 cores per free GPU: the H100s take the pods while they have room, then the
    # H200s.
    assert rule_of_next(view, half_gpu_pod("8")) == RICH
    assert classes_of_a_burst(view, 4, half_gpu_pod("8")) == [H100, H100, H100, H200]
    assert rule_of_next(view, half_gpu_pod("8")) == LARGEST_SHARE


def test_a_share_within_the_cpu_per_free_gpu_of_the_larger_class_takes_the_larger_free_share() -> None:
    view = cpu_bound_view(h200_cpu_milli=24_000)
    assert classes_of_a_burst(view, 1, half_gpu_pod("1")) == [H200]  # 2 cores per GPU, 3 there
    assert rule_of_next(view, half_gpu_pod("1")) == LARGEST_SHARE
    # A pod that asks no CPU is judged by GPU memory alone.
    assert rule_of_next(cpu_bound_view(h200_cpu_milli=24_000), half_gpu_pod("0")) == LARGEST_SHARE


def test_a_class_that_publishes_no_cpu_headroom_is_not_judged_by_it() -> None:
    assert classes_of_a_burst(cpu_bound_view(h200_cpu_milli=None), 1, half_gpu_pod("8")) == [H200]


def test_the_cpu_per_gpu_of_a_fraction_of_several_gpus_counts_every_gpu_it_takes() -> None:
    # Half of each of two GPUs and 2 cores: 2 cores per GPU (not 4), which the H200s have.
    pod = half_gpu_pod("2")
    pod["metadata"]["annotations"]["gpu-fraction-num-devices"] = "2"
    assert classes_of_a_burst(cpu_bound_view(h200_cpu_milli=24_000), 1, pod) == [H200]
    assert classchoice.Demand(0.5, 0, 2000, 0, devices=2).cpu_per_gpu_milli() == 2000.0
    assert classchoice.Demand(0.5, 0, 2000).cpu_per_gpu_milli() == 4000.0
    assert classchoice.Demand(0.0, 2, 2000).cpu_per_gpu_milli() == 0.0  # whole GPUs: not a share


def test_a_remembered_answer_follows_the_cpu_a_node_frees() -> None:
    view = cpu_bound_view(h200_cpu_milli=24_000)
    assert classes_of_a_burst(view, 1, half_gpu_pod("8")) == [H100]
    # The H200 node's pods end: 400 cores unrequested, 50 per free GPU. The same pod again (its
    # answer remembered) now takes the larger free share.
    h200 = nodefile.load(EXAMPLES / "h200x8-node.yaml")
    view.update_node("h200", node_labels.node_labels(h200, SETTINGS.contract, headroom=(400_000, 1_000_000)))
    assert classes_of_a_burst(view, 1, half_gpu_pod("8")) == [H200]


def test_device_plugin_mode_keeps_the_largest_free_share_where_the_pod_fits() -> None:
    # One pod at a time, labels fresh (the model of docs/benchmarks.md), the rule cost packing.
    [decision] = decisions(cpu_bound_view(h200_cpu_milli=24_000), 1, half_gpu_pod("8"), SETTINGS)
    assert decision["classMemoryMiB"] == H200 and decision["rule"] == LARGEST_SHARE


def test_promised_shares_hold_their_cpu_in_dra_mode_too() -> None:
    # As in device-plugin mode (test_admission): the labels do not move during the burst, and each
    # pod promised to the H200s holds 8 of their 24 cores, so they take three and no more. Without
    # the CPU in the promises the H200s' free GPUs would read 24 cores between ever fewer GPUs.
    view = cpu_bound_view(h200_cpu_milli=24_000)
    burst = classes_of_a_burst(view, 7, half_gpu_pod("8"))
    assert burst.count(H100) == 4 and burst.count(H200) == 3, burst
    assert rule_of_next(view, half_gpu_pod("8")).endswith("(no node has room now)")


def counted(unplaced: int) -> tuple[cluster.ClusterView, list[int]]:
    """The view, with a stand-in for the pending-pod watch (webhook/waiting.py) counting `unplaced`
    converted pods waiting for a placement (a list to change it)."""
    view = cpu_bound_view(h200_cpu_milli=24_000)
    waiting = [unplaced]
    view.count_unplaced = lambda: waiting[0]
    return view, waiting


def test_one_pod_at_a_time_the_rule_waits_for_a_backlog() -> None:
    # Placed one at a time, the "fits now" of the labels judges the pod: the larger free share.
    for unplaced in (0, classchoice.BEHIND_PODS):
        [decision] = decisions(counted(unplaced)[0], 1, half_gpu_pod("8"))
        assert (decision["classMemoryMiB"], decision["rule"]) == (H200, LARGEST_SHARE)
    # A burst: more wait than a scheduler keeping up leaves.
    [decision] = decisions(counted(classchoice.BEHIND_PODS + 1)[0], 1, half_gpu_pod("8"))
    assert (decision["classMemoryMiB"], decision["rule"]) == (H100, RICH)


def test_a_remembered_answer_follows_the_backlog() -> None:
    view, waiting = counted(classchoice.BEHIND_PODS + 1)
    assert classes_of_a_burst(view, 2, half_gpu_pod("8")) == [H100, H100]  # the H200s' share is larger
    waiting[0] = 0  # the scheduler caught up: the same pod (its answer remembered) now takes it
    assert classes_of_a_burst(view, 1, half_gpu_pod("8")) == [H200]
