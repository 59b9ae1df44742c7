"""The kube-scheduler model: filter, node affinity operators and the integer scoring formulas,
checked against values computed by hand from kube-scheduler-scoring.md."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice import affinity
from gpuslice.sim import scheduler

GIB = 1024**3
GPU_MEMORY = "gpuslice.io/gpu-memory"


def _pod(
    *,
    cpu: str | None = "1000m",
    memory: str | None = "1Gi",
    gpu_units: int = 0,
    affinity: dict[str, Any] | None = None,
    init: list[dict[str, Any]] | None = None,
    name: str = "p",
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    resources: dict[str, Any] = {"requests": requests}
    if gpu_units:
        resources["limits"] = {GPU_MEMORY: str(gpu_units)}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}]}
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name}, "spec": spec}


def _cluster() -> scheduler.Cluster:
    """n0: 4 CPUs, 8 GiB, 100 units, empty. n1: 8 CPUs, 8 GiB, 100 units, holding 2 CPUs, 4 GiB, 60 units.
    n2: 2 CPUs, 4 GiB, no GPU."""
    cluster = scheduler.Cluster(
        ["n0", "n1", "n2"],
        [
            {"cpu": 4000, "memory": 8 * GIB, GPU_MEMORY: 100},
            {"cpu": 8000, "memory": 8 * GIB, GPU_MEMORY: 100},
            {"cpu": 2000, "memory": 4 * GIB},
        ],
        [
            {"zone": "a", "gpu.count": "2", "product": "T4"},
            {"zone": "b", "gpu.count": "8", "product": "G2"},
            {"zone": "a"},
        ],
    )
    cluster.bind(1, scheduler.read_pod(_pod(cpu="2", memory="4Gi", gpu_units=60)))
    return cluster


NODES = np.array([0, 1])
POD = scheduler.read_pod(_pod(gpu_units=20))


def test_a_pod_request_is_read_in_milli_cpu_bytes_and_units() -> None:
    assert POD.requests == {"cpu": 1000, "memory": GIB, GPU_MEMORY: 20}
    assert POD.container_devices == (("c", {GPU_MEMORY: 20}),)


def test_the_pod_request_is_the_larger_of_the_app_containers_sum_and_the_largest_init_container() -> None:
    manifest = _pod(cpu="1", init=[{"name": "i", "resources": {"requests": {"cpu": "3", "memory": "100Mi"}}}])
    manifest["spec"]["containers"].append({"name": "d", "resources": {"requests": {"cpu": "500m"}}})
    pod = scheduler.read_pod(manifest)
    assert pod.requests["cpu"] == 3000
    assert pod.requests["memory"] == GIB
    # Scoring counts the container without a memory request as 200 MiB (NonZeroRequested).
    assert pod.nonzero_memory == GIB + 200 * 1024 * 1024


def test_a_sidecar_adds_to_the_running_containers_and_an_init_container_runs_beside_earlier_sidecars() -> None:
    sidecar = {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}
    setup = {"name": "i", "resources": {"requests": {"cpu": "2500m"}}}
    pod = scheduler.read_pod(_pod(cpu="1", init=[sidecar, setup]))
    # Running: 1 + 2 CPUs; the init container's peak: 2.5 beside the 2 of the sidecar before it.
    assert pod.requests["cpu"] == 4500
    assert pod.requests["memory"] == 2 * GIB
    # Scoring: the init container's missing memory counts 200 MiB, beside the sidecar's 1 GiB.
    assert pod.nonzero_memory == 2 * GIB


def test_pod_level_requests_replace_the_containers_and_the_overhead_is_added() -> None:
    manifest = _pod(cpu="1", memory=None, gpu_units=20)
    manifest["spec"]["resources"] = {"requests": {"cpu": "3", "memory": "2Gi"}}
    manifest["spec"]["overhead"] = {"cpu": "250m", "memory": "64Mi"}
    pod = scheduler.read_pod(manifest)
    assert pod.requests == {"cpu": 3250, "memory": 2 * GIB + 64 * 2**20, GPU_MEMORY: 20}
    # Pod-level memory replaces the container's non-zero default for scoring too.
    assert (pod.nonzero_cpu, pod.nonzero_memory) == (3250, 2 * GIB + 64 * 2**20)


def test_a_bad_pod_level_quantity_is_refused_naming_it() -> None:
    manifest = _pod()
    manifest["spec"]["resources"] = {"requests": {"cpu": "lots"}}
    with pytest.raises(scheduler.PodSpecError, match=r"pod p pod-level requests or overhead: cpu quantity 'lots'"):
        scheduler.read_pod(manifest)


def test_a_bad_quantity_is_refused_naming_the_pod_container_and_value() -> None:
    with pytest.raises(scheduler.PodSpecError, match=r"pod p container c: cpu quantity 'lots'"):
        scheduler.read_pod(_pod(cpu="lots"))


def test_least_allocated_scores_free_share_of_cpu_and_memory_with_integer_division() -> None:
    # n0: cpu (4000-1000)*100/4000 = 75, memory (8-1)*100/8 = 87 -> (75+87)/2 = 81
    # n1: cpu (8000-3000)*100/8000 = 62, memory (8-5)*100/8 = 37 -> (62+37)/2 = 49
    scores = _cluster().fit_score(POD, NODES, scheduler.default_profile())
    assert scores.tolist() == [81, 49]


def test_most_allocated_weighs_gpu_memory_ten_times_in_the_binpack_profile() -> None:
    # n0: cpu 25, memory 12, gpu 20 -> (25 + 12 + 200) / 12 = 19
    # n1: cpu 37, memory 62, gpu 80 -> (37 + 62 + 800) / 12 = 74
    scores = _cluster().fit_score(POD, NODES, scheduler.binpack_profile(GPU_MEMORY))
    assert scores.tolist() == [19, 74]


def test_an_extended_resource_the_pod_does_not_request_is_left_out_of_the_score() -> None:
    pod = scheduler.read_pod(_pod())
    # n0: cpu 25, memory 12 -> 37 / 2 = 18 (gpu-memory neither scored nor weighted)
    assert _cluster().fit_score(pod, NODES, scheduler.binpack_profile(GPU_MEMORY)).tolist() == [18, 49]


def test_requested_to_capacity_ratio_rounds_the_weighted_mean_of_the_shape_scores() -> None:
    # Shape (0,0)-(100,10): score = utilization. n0: (25 + 12 + 10*20) / 12 = 19.75 -> 20
    # n1: (37 + 62 + 10*80) / 12 = 74.9 -> 75 (MostAllocated's integer division gives 74)
    profile = scheduler.binpack_profile(GPU_MEMORY, strategy="RequestedToCapacityRatio")
    assert _cluster().fit_score(POD, NODES, profile).tolist() == [20, 75]


def test_a_falling_shape_truncates_toward_zero_as_go_does() -> None:
    # Shape (0,10)-(30,0) at 25% utilization: 100 + (-100*25)/30 = 100 - 83 = 17 (not 16)
    scores = scheduler._shape_score(np.array([25, 0, 30, 90]), ((0, 10), (30, 0)))
    assert scores.tolist() == [17, 100, 0, 0]


def test_balanced_allocation_scores_how_much_the_pod_changes_the_nodes_balance() -> None:
    # kube-scheduler 1.37: balance = (1 - std of the cpu/memory fractions) x 100, truncated, with and
    # without the pod; score = 50 + (50 + with - without) / 2.
    # n0: without 0, 0 -> 100; with 0.25, 0.125 -> std 0.0625 -> 93; 50 + 43 / 2 = 71.
    # n1: without 0.25, 0.5 -> 87; with 0.375, 0.625 -> 87; 50 + 50 / 2 = 75 (the older formula,
    # the balance with the pod alone, gave [93, 87]: the other way round).
    assert _cluster().balanced_score(POD, NODES, scheduler.default_profile()).tolist() == [71, 75]
    # Two CPUs, no memory: n0 0.5, 0 -> 75 from 100: 50 + 25 / 2 = 62; n1 0.5, 0.5 -> 100 from 87: 81.
    cpu_only = scheduler.read_pod(_pod(cpu="2", memory=None))
    assert _cluster().balanced_score(cpu_only, NODES, scheduler.default_profile()).tolist() == [62, 81]


def test_balanced_allocation_skips_a_pod_that_requests_neither_cpu_nor_memory() -> None:
    best_effort = scheduler.read_pod(_pod(cpu=None, memory=None, gpu_units=20))
    assert _cluster().balanced_score(best_effort, NODES, scheduler.default_profile()).tolist() == [0, 0]


def test_preferred_affinity_is_normalised_so_the_best_node_gets_100() -> None:
    pod = scheduler.read_pod(
        _pod(
            affinity={
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 30,
                        "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    },
                    {"weight": 20, "preference": {"matchExpressions": [{"key": "gpu.count", "operator": "Exists"}]}},
                ]
            }
        )
    )
    assert _cluster().affinity_score(pod, np.array([0, 1, 2])).tolist() == [100, 40, 60]


def _required(*expressions: dict[str, Any]) -> scheduler.PodRequest:
    terms = {"nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}
    return scheduler.read_pod(_pod(affinity={"requiredDuringSchedulingIgnoredDuringExecution": terms}))


@pytest.mark.parametrize(
    ("expression", "matching"),
    [
        ({"key": "zone", "operator": "In", "values": ["a"]}, ["n0", "n2"]),
        ({"key": "product", "operator": "NotIn", "values": ["T4"]}, ["n1", "n2"]),
        ({"key": "product", "operator": "Exists"}, ["n0", "n1"]),
        ({"key": "product", "operator": "DoesNotExist"}, ["n2"]),
        ({"key": "gpu.count", "operator": "Gt", "values": ["4"]}, ["n1"]),
        ({"key": "gpu.count", "operator": "Lt", "values": ["4"]}, ["n0"]),
        ({"key": "product", "operator": "Gt", "values": ["1"]}, []),
        ({"key": "absent", "operator": "NotIn", "values": ["x"]}, ["n0", "n1", "n2"]),
    ],
    ids=["in", "not-in-matches-missing", "exists", "does-not-exist", "gt", "lt", "gt-on-text", "not-in-unknown-key"],
)
def test_node_affinity_operators_select_the_nodes_kubernetes_would(
    expression: dict[str, Any], matching: list[str]
) -> None:
    cluster = _cluster()
    mask = cluster.affinity_mask(_required(expression))
    assert [cluster.names[i] for i in np.flatnonzero(mask)] == matching


def test_required_terms_are_ored_and_an_empty_term_list_matches_no_node() -> None:
    cluster = _cluster()
    either = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "product", "operator": "DoesNotExist"}]},
        ]
    }
    pod = scheduler.read_pod(_pod(affinity={"requiredDuringSchedulingIgnoredDuringExecution": either}))
    assert np.flatnonzero(cluster.affinity_mask(pod)).tolist() == [1, 2]
    nothing = scheduler.read_pod(
        _pod(affinity={"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}})
    )
    assert not cluster.affinity_mask(nothing).any()


def test_a_gt_with_a_non_integer_value_is_refused() -> None:
    with pytest.raises(scheduler.PodSpecError, match="Gt needs exactly one integer value"):
        _required({"key": "gpu.count", "operator": "Gt", "values": ["four"]})


def test_changed_labels_are_seen_by_the_next_filter() -> None:
    cluster = _cluster()
    pod = _required({"key": "gpu.count", "operator": "Gt", "values": ["4"]})
    cluster.set_labels(0, {"zone": "a", "gpu.count": "16"})
    assert np.flatnonzero(cluster.affinity_mask(pod)).tolist() == [0, 1]
    cluster.set_labels(1, {"zone": "b"})
    assert np.flatnonzero(cluster.affinity_mask(pod)).tolist() == [0]


def test_a_pod_that_fits_nowhere_gets_kube_schedulers_summary() -> None:
    sched = scheduler.Scheduler(_cluster(), scheduler.default_profile(), np.random.default_rng(0))
    decision = sched.schedule(scheduler.read_pod(_pod(gpu_units=50, memory="9Gi")))
    assert decision.node is None
    assert decision.message == (
        "0/3 nodes are available: 2 Insufficient gpuslice.io/gpu-memory, 3 Insufficient memory."
    )


def test_the_default_profile_spreads_and_the_binpack_profile_packs() -> None:
    spread = scheduler.Scheduler(_cluster(), scheduler.default_profile(), np.random.default_rng(0))
    pack = scheduler.Scheduler(_cluster(), scheduler.binpack_profile(GPU_MEMORY), np.random.default_rng(0))
    # default: n0 81 + 93 = 174, n1 49 + 87 = 136; binpack: n0 19 + 93, n1 74 + 87
    assert spread.schedule(POD).node == 0
    assert pack.schedule(POD).node == 1


@pytest.mark.parametrize(("nodes", "expected"), [(50, 50), (1000, 420), (1213, 497), (10000, 500)])
def test_the_adaptive_share_of_nodes_to_score_follows_kube_scheduler(nodes: int, expected: int) -> None:
    cluster = scheduler.Cluster([f"n{i}" for i in range(nodes)], [{"cpu": 1000}] * nodes, [{}] * nodes)
    assert (
        scheduler.Scheduler(cluster, scheduler.default_profile(), np.random.default_rng(0)).nodes_to_find() == expected
    )


def test_filtering_stops_after_enough_feasible_nodes_and_resumes_where_it_stopped() -> None:
    count = 200
    cluster = scheduler.Cluster([f"n{i}" for i in range(count)], [{"cpu": 1000}] * count, [{}] * count)
    sched = scheduler.Scheduler(
        cluster, scheduler.default_profile(percentage_of_nodes_to_score=50), np.random.default_rng(0)
    )
    first = sched.schedule(scheduler.read_pod(_pod(cpu="100m", memory=None)))
    assert first.feasible == 100 and first.node is not None and first.node < 100
    assert sched.next_start == 100
    second = sched.schedule(scheduler.read_pod(_pod(cpu="100m", memory=None)))
    assert second.node is not None and second.node >= 100


def test_equal_top_scores_are_broken_at_random_and_the_seed_makes_it_repeatable() -> None:
    def picks(seed: int) -> list[int]:
        cluster = scheduler.Cluster(["a", "b", "c"], [{"cpu": 100000}] * 3, [{}] * 3)
        sched = scheduler.Scheduler(cluster, scheduler.default_profile(), np.random.default_rng(seed))
        out = []
        for _ in range(20):
            decision = sched.schedule(scheduler.read_pod(_pod(cpu=None, memory=None)))
            assert decision.node is not None
            out.append(decision.node)
        return out

    assert picks(7) == picks(7)
    assert set(picks(7)) == {0, 1, 2}


# Label values and bounds that tell the operators apart: equal, either side, signs, 64-bit edges,
# and what int() reads but the scheduler does not.
_VALUES = ["0", "1", "2", "10", "-1", "+1", "007", "a", "1_0", str(2**63 - 1), str(2**63), str(2**53 + 1)]
_KEYS = ["k1", "k2"]
_NAMES = ["n0", "n1", "n2", "n3"]


def _expressions() -> st.SearchStrategy[dict[str, Any]]:
    key = st.sampled_from([*_KEYS, "no-node-has-it"])
    value = st.sampled_from(_VALUES)
    return st.one_of(
        st.builds(
            lambda k, o, v: {"key": k, "operator": o, "values": v},
            key,
            st.sampled_from(["In", "NotIn"]),
            st.lists(value, min_size=1, max_size=3),
        ),
        st.builds(lambda k, o: {"key": k, "operator": o}, key, st.sampled_from(["Exists", "DoesNotExist"])),
        st.builds(
            lambda k, o, v: {"key": k, "operator": o, "values": [v]},
            key,
            st.sampled_from(["Gt", "Lt"]),
            st.sampled_from([v for v in _VALUES if affinity.integer(v) is not None]),
        ),
    )


def _fields() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda o, v: {"key": "metadata.name", "operator": o, "values": v},
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.sampled_from(_NAMES), min_size=1, max_size=2),
    )


_TERMS = st.builds(
    lambda e, f: {**({"matchExpressions": e} if e else {}), **({"matchFields": f} if f else {})},
    st.lists(_expressions(), max_size=3),
    st.lists(_fields(), max_size=1),
)


@settings(max_examples=300, deadline=None)
@given(
    labels=st.lists(st.dictionaries(st.sampled_from(_KEYS), st.sampled_from(_VALUES)), min_size=4, max_size=4),
    terms=st.none() | st.lists(_TERMS, max_size=3),
    selector=st.dictionaries(st.sampled_from(_KEYS), st.sampled_from(_VALUES), max_size=1),
)
def test_the_vectorised_filter_decides_as_the_one_node_affinity_matcher(
    labels: list[dict[str, str]], terms: list[dict[str, Any]] | None, selector: dict[str, str]
) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "c"}], "nodeSelector": selector}
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    cluster = scheduler.Cluster(_NAMES, [{}] * len(_NAMES), [{}] * len(_NAMES))
    for i, node_labels in enumerate(labels):  # set twice: a changed or removed label is seen
        cluster.set_labels(i, {k: "x" for k in _KEYS})
        cluster.set_labels(i, node_labels)
    mask = cluster.affinity_mask(scheduler.read_pod({"metadata": {"name": "p"}, "spec": spec}))
    assert mask.tolist() == [affinity.admits(spec, n, labels[i]) for i, n in enumerate(_NAMES)]


def _single_requirements() -> list[dict[str, Any]]:
    integers = [v for v in _VALUES if affinity.integer(v) is not None]
    return (
        [{"key": "k1", "operator": o, "values": [v]} for o in ("In", "NotIn") for v in _VALUES]
        + [{"key": "k1", "operator": o, "values": [v]} for o in ("Gt", "Lt") for v in integers]
        + [{"key": k, "operator": o} for k in ("k1", "no-node-has-it") for o in ("Exists", "DoesNotExist")]
        + [{"key": "no-node-has-it", "operator": o, "values": ["1"]} for o in ("In", "NotIn", "Gt", "Lt")]
        + [{"key": "metadata.name", "operator": o, "values": ["n1"]} for o in ("In", "NotIn")]
    )


@pytest.mark.parametrize(
    "requirement", _single_requirements(), ids=lambda r: f"{r['key']} {r['operator']} {r.get('values', '')}"
)
def test_each_requirement_filters_every_label_value_as_the_one_matcher(requirement: dict[str, Any]) -> None:
    names = [f"n{i}" for i in range(len(_VALUES) + 1)]
    labels = [{"k1": v} for v in _VALUES] + [{}]  # every value, and the label missing
    cluster = scheduler.Cluster(names, [{}] * len(names), labels)
    field = requirement["key"] == "metadata.name"
    term = {"matchFields" if field else "matchExpressions": [requirement]}
    spec = {
        "containers": [{"name": "c"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}},
    }
    mask = cluster.affinity_mask(scheduler.read_pod({"metadata": {"name": "p"}, "spec": spec}))
    assert mask.tolist() == [affinity.admits(spec, n, labels[i]) for i, n in enumerate(names)]
