"""FGD in gpuslice-sim (sim/fgd.py): the fragmentation measure on hand-built nodes, the choice of
least growth, both tie-breaks, and replays end to end (no ../shared data needed)."""

from __future__ import annotations

import io
import json
import pathlib
from typing import Any

import numpy as np
import pytest

from gpuslice.sim import fgd, placements, replay, trace
from gpuslice.sim import main as sim_main

TINY = pathlib.Path(__file__).parents[1] / "data" / "trace"
TINY_ARGS = ["--nodes", str(TINY / "tiny_nodes.csv"), "--pods", str(TINY / "tiny_pods.csv")]


def _pod(
    name: str, milli: int, *, gpus: int = 1, cpu: int = 1000, memory: int = 1024, spec: tuple[str, ...] = ()
) -> trace.TracePod:
    return trace.TracePod(name, cpu, memory, gpus if milli else 0, milli, spec)


def _mix(*pods: trace.TracePod) -> fgd.Mix:
    return fgd.workload_mix(pods)


def _node(name: str, gpus: int = 2, *, model: str = "T4", cpu: int = 32000, memory: int = 65536) -> trace.TraceNode:
    return trace.TraceNode(name, cpu, memory, gpus, model)


# --- the fragmentation measure ---------------------------------------------------------------

FREE = [300, 700, 1000, 0]  # a node of four GPUs: 0.3, 0.7 and 1 GPU free, one GPU full


def test_a_share_leaves_as_fragment_the_gpus_whose_free_share_is_below_it() -> None:
    [f] = fgd.fragmentation(FREE, 8000, "T4", _mix(_pod("half", 500)))
    assert f == 300  # only the 0.3 GPU is too small for a half; the 0.7 and the whole GPU can take one


def test_a_whole_gpu_task_leaves_every_partly_used_gpu_as_fragment() -> None:
    [f] = fgd.fragmentation(FREE, 8000, "T4", _mix(_pod("whole", 1000)))
    assert f == 300 + 700


def test_a_multi_gpu_task_that_finds_too_few_whole_gpus_leaves_all_free_gpu_as_fragment() -> None:
    [f] = fgd.fragmentation(FREE, 8000, "T4", _mix(_pod("two", 1000, gpus=2)))
    assert f == 2000


@pytest.mark.parametrize(
    "pod",
    [
        _pod("cpu-hungry", 100, cpu=9000),
        _pod("wrong-model", 100, spec=("V100M32",)),
        _pod("cpu-only", 0),  # asks for no GPU: the paper counts all free GPU as fragment for it
    ],
    ids=lambda p: p.name,
)
def test_a_task_that_cannot_use_the_node_leaves_all_free_gpu_as_fragment(pod: trace.TracePod) -> None:
    [f] = fgd.fragmentation(FREE, 8000, "T4", _mix(pod))
    assert f == 2000


def test_memory_is_not_part_of_the_measure_as_in_the_papers_simulator() -> None:
    # Its task types and nodes are CPU and GPUs only: a type that asks more memory than the node has
    # left is measured like any other, and types differing only in memory are one type.
    mix = _mix(_pod("small", 500, memory=1024), _pod("large", 500, memory=900_000))
    assert list(mix.count) == [2]
    [f] = fgd.fragmentation(FREE, 8000, "T4", mix)
    assert f == 300


def test_memory_still_binds_through_the_filter() -> None:
    state = fgd.State([_node("roomy", memory=65536), _node("tight", memory=4096)], _mix(_pod("half", 500)))
    ok, failed = state.feasible(_pod("hungry", 500, memory=8192))
    assert list(ok) == [True, False] and failed == {"Insufficient memory": 1}


def test_only_the_most_common_types_holding_the_popularity_threshold_are_weighed() -> None:
    pods = [_pod(f"half-{i}", 500) for i in range(90)] + [_pod(f"whole-{i}", 1000) for i in range(6)]
    pods += [_pod(f"quarter-{i}", 250) for i in range(4)]
    assert list(fgd.workload_mix(pods, popularity=0.95).count) == [90, 6]  # 96 of 100 reach 95 %: no quarters
    assert sorted(fgd.workload_mix(pods).count) == [4, 6, 90]  # by default every type
    # Equal counts: the larger type first (by CPU, then share), as the paper's simulator orders them.
    tied = [_pod("a", 500, cpu=1000), _pod("b", 500, cpu=2000), _pod("c", 250, cpu=2000)]
    mix = fgd.workload_mix(tied, popularity=0.5)
    assert (list(mix.cpu_milli), list(mix.gpu_milli)) == ([2000, 2000], [250, 500])
    with pytest.raises(ValueError, match="popularity"):
        fgd.workload_mix(pods, popularity=0)


def test_a_share_no_single_gpu_has_room_for_leaves_all_free_gpu_as_fragment() -> None:
    [f] = fgd.fragmentation([300, 700, 0], 8000, "T4", _mix(_pod("big", 800)))
    assert f == 1000  # 1 GPU free in all, but no GPU has 0.8: a share does not span GPUs


def test_task_types_are_weighted_by_their_count_in_the_workload() -> None:
    mix = _mix(_pod("a", 500), _pod("b", 500), _pod("c", 500), _pod("d", 1000))
    assert list(mix.count) == [3, 1]  # three halves, one whole GPU: one type each
    state = fgd.State([_node("n", 4)], mix)
    state.free[0] = FREE
    state.expected[0] = state._expected(state.free, state.cpu, state.model)[0]
    assert state.expected[0] == 3 * 300 + 1 * 1000


# --- the choice -------------------------------------------------------------------------------


def _state(nodes: list[trace.TraceNode], mix: fgd.Mix, free: dict[int, list[int]], **options: Any) -> fgd.State:
    state = fgd.State(nodes, mix, **options)
    for index, shares in free.items():
        state.free[index] = shares
    state.expected = state._expected(state.free, state.cpu, state.model)
    return state


@pytest.mark.parametrize("scored", [True, False], ids=["integer-score", "exact-growth"])
def test_the_pod_goes_where_expected_fragmentation_grows_least(scored: bool) -> None:
    # The workload is whole-GPU tasks: half a GPU on an empty GPU strands the other half (+500);
    # on the half-used GPU of b-node it fills that GPU and removes its fragment (-500).
    mix = _mix(_pod("whole", 1000))
    state = _state([_node("a-node"), _node("b-node")], mix, {1: [1000, 500]}, scored=scored)
    node, after = state.choose(_pod("half", 500), "fixed", np.random.default_rng(0))
    assert state.names[node] == "b-node"  # not the smaller name: the growth decides first
    assert list(after) == [1000, 0]


def test_within_a_node_the_share_goes_on_the_gpu_that_strands_least() -> None:
    mix = _mix(_pod("third", 400))
    state = _state([_node("n", 3)], mix, {0: [1000, 450, 800]})
    _, after = state.choose(_pod("third", 400), "fixed", np.random.default_rng(0))
    # On the 0.45 GPU the 0.05 left becomes a fragment (+50); on the 0.8 GPU the 0.4 left stays
    # usable (+0), as does the 0.6 left on the whole GPU (+0): the lowest index of the best two.
    assert list(after) == [600, 450, 800]


def test_fixed_ties_go_to_the_lexicographically_smallest_node_name() -> None:
    nodes = [_node("n-2"), _node("n-10"), _node("n-1"), _node("n-11")]
    state = _state(nodes, _mix(_pod("half", 500)), {})
    for seed in range(5):
        node, _ = state.choose(_pod("half", 500), "fixed", np.random.default_rng(seed))
        assert state.names[node] == "n-1"


def test_random_ties_follow_the_seed() -> None:
    nodes = [_node(f"n-{i:02d}") for i in range(20)]
    state = _state(nodes, _mix(_pod("half", 500)), {})

    def pick(seed: int) -> int:
        return state.choose(_pod("half", 500), "random", np.random.default_rng(seed))[0]

    picks = {pick(seed) for seed in range(10)}
    assert len(picks) > 1  # twenty equal nodes: ten seeds do not all land on one
    assert all(pick(seed) == pick(seed) for seed in range(3))  # the same seed, the same node


def test_the_integer_score_ties_nodes_whose_growths_differ_by_little() -> None:
    # A rare task type (1 in 1,000) needs 20 CPUs: placing the pod on a-node leaves it 19.5 and
    # strands a-node's GPUs for that type, so a-node's growth is 0.0014 GPU more than b-node's.
    # The exact growth tells them apart; the 0..100 score of a kube-scheduler plugin does not
    # (both 40), and the fixed tie-break then takes the smaller name.
    pods = [*(_pod(f"t{i}", 1000) for i in range(999)), _pod("rare", 10, cpu=20000)]
    mix = fgd.workload_mix(pods, popularity=1.0)  # every type weighed: the rare one too
    nodes = [_node("a-node", cpu=20500), _node("b-node")]
    pod = _pod("p", 600)
    exact = _state(nodes, mix, {}, scored=False)
    assert exact.names[exact.choose(pod, "fixed", np.random.default_rng(0))[0]] == "b-node"
    scored = _state(nodes, mix, {}, scored=True)
    assert scored.names[scored.choose(pod, "fixed", np.random.default_rng(0))[0]] == "a-node"


def test_a_pod_no_node_can_take_is_unschedulable_with_the_filters_named() -> None:
    state = _state([_node("n", 1)], _mix(_pod("half", 500)), {0: [300]})
    assert state.choose(_pod("half", 500), "fixed", np.random.default_rng(0)) is None
    _, stopped = state.feasible(_pod("half", 500))
    assert stopped == {"no GPU with the share free": 1}


def test_sampling_scores_only_part_of_the_feasible_nodes_from_where_the_last_cycle_stopped() -> None:
    nodes = [_node(f"n-{i:04d}") for i in range(300)]
    state = _state(nodes, _mix(_pod("half", 500)), {}, percentage_of_nodes_to_score=0)
    first = state._scored_nodes(np.ones(300, dtype=bool))
    second = state._scored_nodes(np.ones(300, dtype=bool))
    assert len(first) == len(second) == 144  # the adaptive default: 50 % - 300 // 125 = 48 % of 300 nodes
    assert first[0] == 0 and second[0] == 144


# --- replays ----------------------------------------------------------------------------------


def _policy(tie: str) -> fgd.Policy:
    pods = trace.load_pods(TINY / "tiny_pods.csv")
    return fgd.policies(pods)[f"fgd-{tie}-ties"]


@pytest.mark.parametrize("tie", fgd.TIE_BREAKS)
def test_a_replay_grants_exactly_what_the_placed_pods_asked_for(tie: str) -> None:
    nodes = trace.load_nodes(TINY / "tiny_nodes.csv")
    pods = trace.load_pods(TINY / "tiny_pods.csv")
    arrivals = replay.workload(pods, replay.gpu_capacity_milli(nodes), 1.3, np.random.default_rng(5))
    result = fgd.replay_fgd(nodes, arrivals, _policy(tie), seed=5, placements=True)
    assert result.placed_pods + result.failed_pods == len(arrivals)
    assert result.admission_failures == result.denied_pods == 0
    assert 0 < result.gpu_allocation_ratio == result.requested_allocation_ratio <= 1
    assert result.allocation_curve == result.requested_allocation_curve
    assert len(result.allocation_curve) >= 131
    # The placement records recompute to the reported figures, as gpuslice's do.
    out = io.StringIO()
    placements.write(out, [(result.name, 5, "tiny_pods.csv", result)])
    [figures] = placements.recompute(out.getvalue().splitlines())
    assert figures.matches and figures.placed == result.placed_pods


def test_gpuslice_sim_runs_the_fgd_configurations_beside_gpuslice(capsys: pytest.CaptureFixture[str]) -> None:
    names = "fgd-fixed-ties,fgd-random-ties,gpuslice-default"
    assert sim_main.main([*TINY_ARGS, "--json", "--seeds", "2", "--jobs", "1", "--configs", names]) == 0
    document = json.loads(capsys.readouterr().out)
    entries = {c["name"]: c for c in document["configurations"]}
    assert list(entries) == names.split(",")
    for name in fgd.CONFIGURATION_NAMES:
        assert entries[name]["gpu_allocation_ratio"] == entries[name]["requested_allocation_ratio"] > 0
        assert [s["seed"] for s in entries[name]["seeds"]] == [42, 43]


def test_fgd_configurations_are_refused_on_the_real_scheduler(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        sim_main.main([*TINY_ARGS, "--scheduler", "kube", "--configs", "fgd-random-ties"])
    assert exit_.value.code == 2
    assert "only with --scheduler model" in capsys.readouterr().err


def test_fgd_scores_every_node_unless_the_percentage_is_given() -> None:
    default = sim_main.parse_args(TINY_ARGS)
    assert (default.percentage_of_nodes_to_score, default.fgd_percentage_of_nodes_to_score) == (0, 100)
    given = sim_main.parse_args([*TINY_ARGS, "--percentage-of-nodes-to-score", "0"])
    assert (given.percentage_of_nodes_to_score, given.fgd_percentage_of_nodes_to_score) == (0, 0)


def test_the_exact_growth_is_chosen_on_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ranked: list[bool] = []
    replay_fgd = fgd.replay_fgd

    def spy(nodes: Any, arrivals: Any, policy: fgd.Policy, **options: Any) -> replay.Result:
        ranked.append(policy.scored)
        return replay_fgd(nodes, arrivals, policy, **options)

    monkeypatch.setattr(fgd, "replay_fgd", spy)
    for score in ("kube", "exact"):
        args = [*TINY_ARGS, "--json", "--jobs", "1", "--configs", "fgd-fixed-ties", "--fgd-score", score]
        assert sim_main.main(args) == 0
        assert 0 < json.loads(capsys.readouterr().out)["configurations"][0]["gpu_allocation_ratio"] <= 1
    assert ranked == [True, False]  # kube: the integer score; exact: the growth itself
