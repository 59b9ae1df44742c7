"""The webhook's steering affinity (the families of webhook/steering/families.py as the package
composes them), evaluated against node label sets made by the device plugin's own labelling code,
with a tiny nodeSelector evaluator that follows Kubernetes' operator semantics, and validated as a
real Pod against Kubernetes 1.29-1.35. (The weights table alone: test_weights.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import kubernetes_validate
import pytest

from gpuslice import contract as contract_
from gpuslice.node import inventory, labels
from gpuslice.webhook import steering

CONTRACT = contract_.Contract()
U = 320  # units of one 80 GiB GPU at 256 MiB
# The nearly-full grades: less than a quarter, a half, the whole of steering.cpuPodsNearlyFullMiB free.
QUARTER, HALF, WHOLE = steering.WEIGHTS.cpu_pod_nearly_full


# --- a tiny nodeSelector evaluator (Kubernetes semantics) ---------------------------------


def matches(expression: dict[str, Any], node_labels: dict[str, str]) -> bool:
    key, op, values = (
        expression["key"],
        expression["operator"],
        expression.get("values", []),
    )
    present = key in node_labels
    if op == "In":
        return present and node_labels[key] in values
    if op == "NotIn":
        return not present or node_labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        # Kubernetes: exactly one integer value; a missing or non-integer label never matches.
        (bound,) = values
        try:
            actual = int(node_labels[key]) if present else None
        except ValueError:
            return False
        if actual is None:
            return False
        return actual > int(bound) if op == "Gt" else actual < int(bound)
    raise AssertionError(f"unknown operator {op}")


def term_matches(expressions: list[dict[str, Any]], node_labels: dict[str, str]) -> bool:
    return all(matches(e, node_labels) for e in expressions)


def preference(preferred: list[dict[str, Any]], node_labels: dict[str, str]) -> int:
    return sum(t["weight"] for t in preferred if term_matches(t["preference"]["matchExpressions"], node_labels))


def node_of(*gpu_units: int, units: int = U) -> inventory.NodeInventory:
    """A node with one GPU per entry; entries give the units already allocated."""
    return inventory.NodeInventory(
        gpus=tuple(
            inventory.Gpu(
                uuid=f"GPU-{i:04d}",
                model="NVIDIA H100 80GB HBM3",
                memory_mib=units * 256,
                index=i,
            )
            for i in range(len(gpu_units))
        )
    )


def labelled(*allocated: int, units: int = U) -> dict[str, str]:
    node = node_of(*allocated, units=units)
    return labels.node_labels(node, CONTRACT, allocated={f"GPU-{i:04d}": a for i, a in enumerate(allocated)})


def share(fraction: float, units_per_gpu: int = U) -> steering.Request:
    return steering.Request(units=round(fraction * units_per_gpu), units_per_gpu=units_per_gpu)


# --- required terms: only nodes where the pod fits on one GPU -----------------------------

REQUIRED_CASES = [
    # (id, request, allocated units per GPU, feasible?)
    ("half fits a free GPU", share(0.5), (0, 0), True),
    ("half fits the free half of one GPU", share(0.5), (160, U), True),
    ("half does not fit two quarter-free GPUs", share(0.5), (240, 240), False),
    (
        "exactly the free block fits",
        steering.Request(units=80, units_per_gpu=U),
        (240, U),
        True,
    ),
    (
        "one unit more than the block does not",
        steering.Request(units=81, units_per_gpu=U),
        (240, U),
        False,
    ),
    (
        "two whole GPUs need two free GPUs",
        steering.Request(units=U, gpus=2, whole_gpus=True),
        (0, 1, 0),
        True,
    ),
    (
        "two whole GPUs not on one free one",
        steering.Request(units=U, gpus=2, whole_gpus=True),
        (0, 1, 1),
        False,
    ),
    (
        "a whole GPU is not a nearly free one",
        steering.Request(units=U, whole_gpus=True),
        (1, 1),
        False,
    ),
]


@pytest.mark.parametrize(
    ("request_", "allocated", "feasible"),
    [c[1:] for c in REQUIRED_CASES],
    ids=[c[0] for c in REQUIRED_CASES],
)
def test_required_terms_admit_exactly_the_nodes_where_the_pod_fits_on_one_gpu(request_, allocated, feasible):
    required, _ = steering.placement_affinity(request_, CONTRACT)
    assert term_matches(required, labelled(*allocated)) is feasible


def test_a_mig_pod_requires_a_free_slice_of_its_profile(demo_node):
    required, preferred = steering.placement_affinity(steering.Request(mig_profile="1g.10gb"), CONTRACT)
    all_free = labels.node_labels(demo_node, CONTRACT)
    migs = [m.uuid for m in demo_node.mig_devices() if m.profile == "1g.10gb"]
    none_free = labels.node_labels(demo_node, CONTRACT, allocated_mig=set(migs))
    assert migs and term_matches(required, all_free)
    assert not term_matches(required, none_free)
    assert preferred and all(t["weight"] <= 100 for t in preferred)


def test_nodes_without_steering_labels_are_not_feasible():
    required, _ = steering.placement_affinity(share(0.25), CONTRACT)
    assert not term_matches(required, {"kubernetes.io/hostname": "cpu-only"})


# --- preferred terms: best fit, then fuller nodes, then the placement score --------------

# Each case: the request and candidate nodes (allocated units per GPU); the node that must win.
PREFERENCE_CASES = [
    (
        "a share goes where it fits most tightly",
        share(0.47),
        {"tight": (0, 160, U), "loose": (0, 40, U)},
        "tight",
    ),
    (
        "a share fills a partly used GPU rather than break a free one",
        share(0.25),
        {"breaks-free-gpu": (0, U, U, U), "partial": (0, 0, 0, 200)},
        "partial",
    ),
    (
        "a loose partial fit still beats breaking the last free GPU of a node",
        share(0.1),
        {"last-free-gpu": (0, U), "loose-partial": (0, 0, 0, 10)},
        "loose-partial",
    ),
    (
        "a closer fit on a node with free GPUs beats a loose fit on a full node",
        share(0.25),
        {"close-with-free": (0, 0, 0, 0, 190), "loose-on-full": (U, U, U, 100)},
        "close-with-free",
    ),
    (
        "when a free GPU must be broken, the node with fewest free GPUs gives it",
        share(0.5),
        {"eight-free": (0,) * 8, "one-free": (0,) + (U,) * 7},
        "one-free",
    ),
    (
        "one whole GPU goes to the node with exactly one free GPU",
        steering.Request(units=U, gpus=1, whole_gpus=True),
        {"all-free": (0,) * 8, "exact": (0, U, U, U), "two-free": (0, 0, 160, U)},
        "exact",
    ),
    (
        "four whole GPUs keep an all-free eight-GPU node for eight-GPU pods",
        steering.Request(units=U, gpus=4, whole_gpus=True),
        {"eight-free": (0,) * 8, "five-free": (0, 0, 0, 0, 0, U, U, U)},
        "five-free",
    ),
]


@pytest.mark.parametrize(
    ("request_", "nodes", "winner"),
    [c[1:] for c in PREFERENCE_CASES],
    ids=[c[0] for c in PREFERENCE_CASES],
)
def test_preferred_terms_pick_the_packing_node(request_, nodes, winner):
    required, preferred = steering.placement_affinity(request_, CONTRACT)
    scores = {}
    for name, allocated in nodes.items():
        node_labels = labelled(*allocated)
        assert term_matches(required, node_labels), f"{name} should be feasible"
        scores[name] = preference(preferred, node_labels)
    best = max(scores.values())
    assert [n for n, s in scores.items() if s == best] == [winner], scores


def test_packing_leads_but_stays_below_least_allocateds_range():
    """kube-scheduler: NodeAffinity normalised so the best node gets 100, times weight 2. A tight fit
    must lead a node that has to open a free GPU, by less than the 100 points LeastAllocated spans,
    so cpu/memory headroom can still overrule GPU packing."""
    _, preferred = steering.placement_affinity(share(0.47), CONTRACT)
    tight = preference(preferred, labelled(0, 160, U))
    breaks = preference(preferred, labelled(0, 0, 0, 0))
    lead = 2 * 100 * (tight - breaks) // tight
    assert 0 < lead < 100


def test_the_placement_score_only_orders_otherwise_equal_nodes():
    _, preferred = steering.placement_affinity(share(0.5), CONTRACT)
    busy = labelled(0, 160) | {CONTRACT.label_placement_score: "20"}
    idle = labelled(0, 160) | {CONTRACT.label_placement_score: "90"}
    idle_but_loose = labelled(0, 60) | {CONTRACT.label_placement_score: "100"}
    assert preference(preferred, idle) > preference(preferred, busy)
    assert preference(preferred, busy) > preference(preferred, idle_but_loose)


def test_a_share_of_unknown_gpu_size_still_prefers_the_tighter_fit():
    request = steering.Request(units=40, units_per_gpu=0)
    _, preferred = steering.placement_affinity(request, CONTRACT)
    assert preference(preferred, labelled(0, 275)) > preference(preferred, labelled(0, 100))


def test_terms_are_few_deterministic_and_within_kubernetes_weight_limits():
    for request in (
        share(0.3),
        steering.Request(units=U, gpus=2, whole_gpus=True),
        steering.Request(mig_profile="3g.40gb"),
    ):
        first = steering.placement_affinity(request, CONTRACT)
        assert first == steering.placement_affinity(request, CONTRACT)
        required, preferred = first
        assert len(required) == 1 and len(preferred) <= 8
        assert preferred[0]["preference"]["matchExpressions"] == required  # the baseline every feasible node gets
        for term in preferred:
            assert 1 <= term["weight"] <= 100
            for expression in term["preference"]["matchExpressions"]:
                assert len(expression["values"]) == 1 and expression["values"][0].lstrip("-").isdigit()


@pytest.mark.parametrize(
    "bad",
    [steering.Request(units=0), steering.Request(units=U, gpus=0, whole_gpus=True)],
    ids=["no units", "no GPUs"],
)
def test_an_empty_request_is_refused_with_a_clear_error(bad):
    with pytest.raises(ValueError, match="at least 1"):
        steering.placement_affinity(bad, CONTRACT)


def test_label_keys_follow_the_configured_prefix():
    custom = contract_.Contract(prefix="example.com")
    required, preferred = steering.placement_affinity(share(0.5), custom)
    keys = {e["key"] for e in required} | {e["key"] for t in preferred for e in t["preference"]["matchExpressions"]}
    assert keys and all(k.startswith("example.com/") for k in keys)


# --- valid Kubernetes objects -------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.29.0", "1.31.0", "1.33.0", "1.35.0"])
@pytest.mark.parametrize(
    "request_",
    [
        share(0.5),
        steering.Request(units=U, gpus=4, whole_gpus=True),
        steering.Request(mig_profile="1g.10gb"),
    ],
    ids=["share", "whole", "mig"],
)
def test_the_affinity_is_a_valid_pod_node_affinity(version, request_):
    required, preferred = steering.placement_affinity(request_, CONTRACT)
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": required}]},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred,
    }
    kubernetes_validate.validate(pod_with(node_affinity), version, strict=True)


def pod_with(node_affinity: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "steered"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "affinity": {"nodeAffinity": node_affinity}},
    }


# --- pods that ask for no device --------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_labels", "weight"),
    [
        ({"kubernetes.io/hostname": "cpu-only"}, steering.WEIGHTS.cpu_pod_cpu_node),  # no gpuslice GPUs
        (labelled(U, U), steering.WEIGHTS.cpu_pod_no_free_gpu),  # every GPU full
        (labelled(U, 40), steering.WEIGHTS.cpu_pod_no_free_gpu),  # no GPU fully free, a share left
        (labelled(U, 0), 0),  # one whole GPU still free
        (labelled(0, 0), 0),
    ],
    ids=["cpu-node", "full", "partly-used", "one-free-gpu", "empty"],
)
def test_a_cpu_pod_prefers_cpu_nodes_then_nodes_whose_gpus_are_no_longer_whole(node_labels, weight):
    # The two terms match disjoint nodes: a node scores one weight or none.
    assert preference(steering.cpu_pod_preferences(CONTRACT), node_labels) == weight


@pytest.mark.parametrize(
    ("node_labels", "weight"),
    [
        ({"kubernetes.io/hostname": "cpu-only"}, steering.WEIGHTS.cpu_pod_cpu_node),
        (labelled(U, U), QUARTER),  # nothing free
        (labelled(U, U - 7), QUARTER),  # 7 units = 1.75 GiB free: below a quarter of 8 GiB
        (labelled(U, U - 8), HALF),  # 2 GiB
        (labelled(U, U - 15), HALF),
        (labelled(U, U - 16), WHOLE),  # 4 GiB
        (labelled(U, U - 31), WHOLE),  # 31 units = 7.75 GiB free
        (labelled(U, U - 32), steering.WEIGHTS.cpu_pod_no_free_gpu),  # 8 GiB free: not below it
        (labelled(U, 40), steering.WEIGHTS.cpu_pod_no_free_gpu),
        (labelled(U, 0), 0),  # one whole GPU still free
    ],
    ids=[
        "cpu-node",
        "full",
        "quarter",
        "at-a-quarter",
        "half",
        "at-a-half",
        "below",
        "at-the-bound",
        "partly-used",
        "one-free-gpu",
    ],
)
def test_with_a_nearly_full_bound_a_cpu_pod_prefers_nodes_with_the_least_gpu_memory_left(node_labels, weight):
    # The terms match disjoint nodes: a node scores one weight or none.
    assert preference(steering.cpu_pod_preferences(CONTRACT, 8192), node_labels) == weight


@pytest.mark.parametrize("nearly_full_mib", [256, 512, 768, 1000, 8192, 1 << 30])
def test_the_nearly_full_grades_cover_the_band_once_for_any_bound(nearly_full_mib):
    """Bounds that coincide with few units are taken once; every free count below the bound scores
    exactly one grade, fewer free units never less than more."""
    terms = steering.cpu_pod_preferences(CONTRACT, nearly_full_mib)
    below = -(-nearly_full_mib // CONTRACT.unit_mib)
    # One full GPU and one with `free` units left (no GPU fully free while free < U).
    scores = [preference(terms, labelled(U, U - free)) for free in range(min(below + 1, U))]
    assert all(score in steering.WEIGHTS.cpu_pod_nearly_full for score in scores[:below])
    assert scores == sorted(scores, reverse=True)
    assert scores[0] == {1: WHOLE, 2: HALF}.get(below, QUARTER)


@pytest.mark.parametrize("version", ["1.29", "1.35"])
@pytest.mark.parametrize("nearly_full_mib", [0, 8192])
def test_the_cpu_pod_preferences_are_a_valid_pod_node_affinity(version, nearly_full_mib):
    terms = steering.cpu_pod_preferences(CONTRACT, nearly_full_mib)
    node_affinity = {"preferredDuringSchedulingIgnoredDuringExecution": terms}
    kubernetes_validate.validate(pod_with(node_affinity), version, strict=True)


# --- keeping the largest nodes whole ----------------------------------------------------------


def test_a_small_pod_keeps_off_a_largest_node_while_all_its_gpus_are_free():
    _, preferred = steering.placement_affinity(dataclasses.replace(share(0.25), largest_node_gpus=8), CONTRACT)
    whole = labelled(*[0] * 8)
    broken = labelled(40, *[0] * 7)  # one GPU partly used: no longer a whole node
    smaller = labelled(0, 0)  # a 2-GPU node can never host the largest pods
    assert preference(preferred, broken) > preference(preferred, whole)
    assert preference(preferred, smaller) > preference(preferred, whole)


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (steering.Request(units=U, gpus=4, whole_gpus=True, largest_node_gpus=8), True),
        (steering.Request(units=U, gpus=8, whole_gpus=True, largest_node_gpus=8), False),  # the largest pods
        (steering.Request(units=40, units_per_gpu=U, largest_node_gpus=1), False),  # one-GPU nodes only
        (steering.Request(units=40, units_per_gpu=U), False),  # class unknown
    ],
    ids=["four-of-eight", "eight-of-eight", "single-gpu-class", "unknown"],
)
def test_only_pods_smaller_than_the_largest_node_of_their_class_get_the_term(request_, expected):
    _, preferred = steering.placement_affinity(request_, CONTRACT)
    keep_whole = {"key": CONTRACT.label_free_gpus, "operator": "Lt", "values": [str(request_.largest_node_gpus)]}
    assert any(t["preference"]["matchExpressions"] == [keep_whole] for t in preferred) is expected


def test_changing_the_returned_lists_does_not_change_the_next_answer():
    """The terms are built once per request and shared; the lists handed out are the caller's."""
    request = steering.Request(units=100, units_per_gpu=318, largest_node_gpus=8)
    required, preferred = steering.placement_affinity(request, CONTRACT)
    expected = (list(required), list(preferred))
    required.append({"key": "x", "operator": "Exists"})
    preferred.clear()
    assert steering.placement_affinity(request, CONTRACT) == expected
    cpu_terms = steering.cpu_pod_preferences(CONTRACT)
    cpu_terms.pop()
    assert len(steering.cpu_pod_preferences(CONTRACT)) == 2


# --- CPU beside the GPUs (steering.cpuPerGpuMilli) ----------------------------------------------

PER_GPU = 12000  # millicores expected per GPU


def with_headroom(*allocated: int, cpu_milli: int = 96_000, memory_mib: int = 100_000) -> dict[str, str]:
    node = node_of(*allocated)
    in_use = {f"GPU-{i:04d}": a for i, a in enumerate(allocated)}
    return labels.node_labels(
        node, CONTRACT, allocated=in_use, headroom=(cpu_milli, memory_mib), cpu_per_gpu_milli=PER_GPU
    )


def balance_of(node_labels: dict[str, str]) -> int:
    return int(node_labels[CONTRACT.label_spare_cpu_milli]) - int(node_labels[CONTRACT.label_short_cpu_milli])


@pytest.mark.parametrize(
    ("allocated", "cpu_milli", "spare", "short"),
    [
        ((0, 0), 40000, 16000, 0),  # two free GPUs reserve 24 cores, 16 beyond them
        ((U // 2, U), 2000, 0, 4000),  # half a GPU free: 6 cores reserved, 2 left
        ((U, U), 5000, 5000, 0),  # nothing free: every core is spare
    ],
    ids=["spare", "short", "full"],
)
def test_the_plugin_publishes_the_cpu_beyond_or_short_of_its_free_gpus(allocated, cpu_milli, spare, short):
    published = with_headroom(*allocated, cpu_milli=cpu_milli)
    assert published[CONTRACT.label_spare_cpu_milli] == str(spare)
    assert published[CONTRACT.label_short_cpu_milli] == str(short)


def test_no_balance_labels_without_the_setting_or_the_headroom():
    node = node_of(0, 0)
    keys = {CONTRACT.label_spare_cpu_milli, CONTRACT.label_short_cpu_milli}
    assert not keys & set(labels.node_labels(node, CONTRACT, headroom=(40000, 1000)))
    assert not keys & set(labels.node_labels(node, CONTRACT, cpu_per_gpu_milli=PER_GPU))


def cpu_share(fraction: float, cpu_milli: int, **kwargs: Any) -> steering.Request:
    return dataclasses.replace(share(fraction), cpu_milli=cpu_milli, cpu_per_gpu_milli=PER_GPU, **kwargs)


@pytest.mark.parametrize("cpu_milli", [0, 1000, 6000, 9000, 20000, 40000])
def test_the_balance_terms_match_exactly_the_nodes_within_their_range(cpu_milli):
    """Nodes whose balance b is within a quarter GPU's CPU of the pod's need score both terms,
    within one GPU's CPU the near one only, further none, on both sides of 0 (two labels)."""
    _, preferred = steering.placement_affinity(cpu_share(0.5, cpu_milli), CONTRACT)
    balance_terms = preferred[-2:]
    need = cpu_milli - PER_GPU // 2
    for b in range(-30000, 50001, 500):
        node_labels = labels.cpu_balance_labels(CONTRACT, b)
        expected = (abs(b - need) <= PER_GPU // 4) * steering.WEIGHTS.cpu_balance_close + (
            abs(b - need) <= PER_GPU
        ) * steering.WEIGHTS.cpu_balance_near
        assert preference(balance_terms, node_labels) == expected, b


def test_a_cpu_hungry_pod_goes_where_cpu_is_spare_and_a_frugal_one_where_it_is_short():
    rich = with_headroom(U // 2, 0, cpu_milli=60000)  # b = 60 - 18 = 42 cores
    poor = with_headroom(U // 2, 0, cpu_milli=16000)  # b = 16 - 18 = -2 cores
    assert balance_of(rich) == 42000 and balance_of(poor) == -2000
    _, hungry = steering.placement_affinity(cpu_share(0.5, 40000), CONTRACT)
    _, frugal = steering.placement_affinity(cpu_share(0.5, 2000), CONTRACT)
    assert preference(hungry, rich) > preference(hungry, poor)
    assert preference(frugal, poor) > preference(frugal, rich)


def test_the_balance_does_not_draw_a_small_pod_to_a_whole_largest_node():
    whole = with_headroom(*[0] * 8, cpu_milli=8 * PER_GPU)  # b = 0: what a pod asking 12 cores per GPU leaves
    _, preferred = steering.placement_affinity(
        steering.Request(units=U, whole_gpus=True, largest_node_gpus=8, cpu_milli=PER_GPU, cpu_per_gpu_milli=PER_GPU),
        CONTRACT,
    )
    assert preference(preferred[-2:], whole) == 0
    assert preference(preferred[-2:], with_headroom(U, *[0] * 7, cpu_milli=7 * PER_GPU)) > 0


@pytest.mark.parametrize(
    "request_",
    [
        share(0.5),  # no CPU request known
        dataclasses.replace(share(0.5), cpu_milli=4000),  # the setting at 0
        steering.Request(units=40, cpu_milli=4000, cpu_per_gpu_milli=PER_GPU),  # GPU size unknown
        steering.Request(mig_profile="1g.10gb", cpu_milli=4000, cpu_per_gpu_milli=PER_GPU),
    ],
    ids=["no-cpu", "setting-off", "size-unknown", "mig"],
)
def test_no_balance_terms_where_the_balance_cannot_be_judged(request_):
    _, preferred = steering.placement_affinity(request_, CONTRACT)
    keys = {e["key"] for t in preferred for e in t["preference"]["matchExpressions"]}
    assert not keys & {CONTRACT.label_spare_cpu_milli, CONTRACT.label_short_cpu_milli}


@pytest.mark.parametrize("version", ["1.29.0", "1.35.0"])
def test_the_balance_terms_are_a_valid_pod_node_affinity(version):
    required, preferred = steering.placement_affinity(cpu_share(0.5, 40000), CONTRACT)
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": required}]},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred,
    }
    kubernetes_validate.validate(pod_with(node_affinity), version, strict=True)


def test_an_absurd_cpu_request_gets_no_balance_terms_rather_than_values_beyond_int64():
    absurd = cpu_share(0.5, 2**63 * 1000)  # what a request of 2**63 cores reads as
    _, preferred = steering.placement_affinity(absurd, CONTRACT)
    _, plain = steering.placement_affinity(dataclasses.replace(absurd, cpu_per_gpu_milli=0), CONTRACT)
    _, sane = steering.placement_affinity(cpu_share(0.5, 4000), CONTRACT)
    assert preferred == plain and len(sane) == len(plain) + 2


# --- host fit: a whole-node pod on the node whose free memory it fills most ---------------------


def whole(gpus: int, memory_mib: int) -> steering.Request:
    return steering.Request(units=U, gpus=gpus, whole_gpus=True, units_per_gpu=U, memory_mib=memory_mib)


def host_fit(preferred: list[dict[str, Any]]) -> list[dict[str, Any]]:
    memory = CONTRACT.label_free_memory_mib
    return [t for t in preferred if any(e["key"] == memory for e in t["preference"]["matchExpressions"])]


@pytest.mark.parametrize(
    ("allocated", "free_memory", "expected"),
    [
        ((0, 0), 300_000, True),  # takes both free GPUs and 256 of 300 GiB free
        ((0, 0), 393_217, False),  # more than a third of the free memory left
        ((0, 0, 0), 300_000, False),  # a free GPU left beside it: the node is not done
        ((U // 2, 0, 0), 300_000, True),  # its last whole GPUs; shares may still use the half
        ((0, 0), 393_216, True),  # exactly 3/2 of the request: a 384 GiB node for a 256 GiB pod
    ],
    ids=["tight", "memory-rich", "gpu-left", "partial-left", "bound"],
)
def test_a_whole_gpu_pod_prefers_the_node_it_fills_with_every_free_gpu_and_most_free_memory(
    allocated, free_memory, expected
):
    _, preferred = steering.placement_affinity(whole(2, 262_144), CONTRACT)
    (term,) = host_fit(preferred)
    node_labels = with_headroom(*allocated, memory_mib=free_memory)
    assert term_matches(term["preference"]["matchExpressions"], node_labels) is expected


def test_the_host_fit_sends_a_whole_node_pod_to_the_smaller_node_where_both_fit():
    # The trace's 8-GPU pods asking 256 GiB fit the 384 GiB G2 nodes and the 768 GiB G3 nodes; the
    # G3 nodes are the only ones for the pods asking 640-720 GiB, so the G2 node must score higher.
    g2, g3 = with_headroom(*[0] * 8, memory_mib=393_216), with_headroom(*[0] * 8, memory_mib=786_432)
    _, preferred = steering.placement_affinity(whole(8, 263_168), CONTRACT)
    assert preference(preferred, g2) == preference(preferred, g3) + steering.WEIGHTS.host_fit


@pytest.mark.parametrize(
    "request_",
    [
        share(0.5),  # a share: a whole GPU's memory is not what it fills
        steering.Request(units=U, gpus=2, whole_gpus=True, units_per_gpu=U),  # no memory request
        whole(2, 2**63),  # absurd: no value beyond int64
    ],
    ids=["share", "no-memory-request", "absurd"],
)
def test_no_host_fit_term_where_it_cannot_be_judged(request_):
    _, preferred = steering.placement_affinity(request_, CONTRACT)
    keys = {e["key"] for t in preferred for e in t["preference"]["matchExpressions"]}
    assert CONTRACT.label_free_memory_mib not in keys


@pytest.mark.parametrize("version", ["1.29.0", "1.35.0"])
def test_the_host_fit_term_is_a_valid_pod_node_affinity(version):
    required, preferred = steering.placement_affinity(whole(8, 263_168), CONTRACT)
    assert host_fit(preferred)
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": required}]},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred,
    }
    kubernetes_validate.validate(pod_with(node_affinity), version, strict=True)
