"""What became of each pod of a replay on the real control plane (sim/kube_outcomes.py), and the
figures and placements a run reports from it, with the node side (sim/kube_nodes.py) deciding
what kubelet granted. A whole replay: tests/e2e/test_real_replay.py."""

from __future__ import annotations

import dataclasses
import io
import time

import pytest

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.sim import kube_dra, kube_nodes, kube_outcomes, placements, replay, trace


def _bound(name: str, units: int, contract: contract_.Contract) -> dict[str, object]:
    """A converted pod as the bound-pods watch shows it."""
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {contract.gpu_memory_resource: str(units)}}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"nodeName": "t4", "containers": [{"name": "main", "resources": resources}]},
        "status": {"phase": "Pending"},
    }


def _t4_node_with(bound: str, units: int) -> tuple[trace.TraceNode, kube_nodes.Fleet, kube_outcomes.Outcomes]:
    """One node of two T4s (60 units of 256 MiB each), the pods named in `bound` bound there in
    turn, `units` each, and kubelet's decision taken for each."""
    settings = config.Config()
    node = trace.TraceNode("t4", 64000, 262144, 2, "T4")
    fleet = kube_nodes.Fleet(None, [node], settings, sharing=True, namespace="default")  # type: ignore[arg-type]
    outcomes = kube_outcomes.Outcomes(fleet)
    for name in bound:
        _bind(fleet, name, units)
    return node, fleet, outcomes


def _bind(fleet: kube_nodes.Fleet, name: str, units: int) -> None:
    pod = _bound(name, units, fleet.contract)
    fleet._decide(f"default/{name}", "t4", pod, fleet._admit(f"default/{name}", "t4", fleet.sims["t4"], pod))


def test_the_kube_runs_placements_hold_what_kubelet_granted_and_recompute_its_figure() -> None:
    # One node of two T4s (60 units of 256 MiB each). a and b: 36 units, one per GPU; c: 36 more
    # units span the two GPUs' 24 free each, refused by Allocate; d: unschedulable; e: denied by
    # the webhook; f: nothing seen.
    node, fleet, outcomes = _t4_node_with("abc", 36)
    arrivals = [trace.TracePod(n, 1000, 1024, 1, 600) for n in "abcdef"]
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    outcomes.on_event(
        "ADDED", {"metadata": {"namespace": "default", "name": "d"}, "status": {"conditions": [unschedulable]}}
    )
    outcomes.deny("default/e", 'admission webhook "pods.gpuslice.io" denied the request: no GPU class')
    capacity = replay.gpu_capacity_milli([node])
    result, unaccounted, lost = kube_outcomes.figures(
        "gpuslice-default", arrivals, outcomes, fleet, capacity, 1.0, 1.0, placements=True
    )
    assert unaccounted == ["default/f"] and lost == 1
    records = result.placements
    assert records is not None
    assert [r["outcome"] for r in records] == ["placed", "placed", "refused", "unschedulable", "denied", "unaccounted"]
    a, b, c, d, e, _ = records
    assert a["node"] == "t4" and len(a["gpus"]) == 1 and a["gpus"][0]["uuid"] != b["gpus"][0]["uuid"]
    assert a["gpus"][0] | {"uuid": ""} == {
        "uuid": "",
        "units": 36,
        "total_units": 60,
        "unit_mib": 256,
        "gpu_memory_mib": 15360,
    }
    assert a["granted_gpus"] == pytest.approx(0.6)
    assert c["node"] == "t4" and c["gpus"] == [] and c["message"].startswith("kubelet: ") and "span" in c["message"]
    assert d["message"] == "0/1 nodes" and d["node"] is None
    assert "denied the request: no GPU class" in e["message"]
    out = io.StringIO()
    placements.write(out, [(result.name, 42, "pods.csv", result)])
    [figures] = placements.recompute(out.getvalue().splitlines())
    assert figures.matches and figures.placed == 2 and figures.pods == 6
    assert figures.gpu_allocation_ratio == pytest.approx(0.6) == pytest.approx(result.gpu_allocation_ratio)


def test_a_refused_pod_created_again_is_not_settled_until_its_new_pod_has_an_outcome() -> None:
    # c and d are refused (36 units cannot span the two T4s' 24 free); the requeuer creates both
    # again. A run that ended then would count them lost.
    node, fleet, outcomes = _t4_node_with("abcd", 36)
    assert [outcomes.settled(f"default/{n}") for n in "abcd"] == [True] * 4
    assert not fleet.decisions["default/c"].admitted and not fleet.decisions["default/d"].admitted
    for name in "cd":
        outcomes.on_event("ADDED", {"metadata": {"namespace": "default", "name": name}, "status": {"phase": "Pending"}})
    assert not outcomes.settled("default/c") and not outcomes.settled("default/d")
    # c waits (the scheduler finds no node); d is bound again and admitted (as if it now asked what fits).
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    outcomes.on_event(
        "MODIFIED", {"metadata": {"namespace": "default", "name": "c"}, "status": {"conditions": [unschedulable]}}
    )
    _bind(fleet, "d", 12)
    assert outcomes.settled("default/c") and outcomes.settled("default/d")
    arrivals = [trace.TracePod(n, 1000, 1024, 1, 600) for n in "bcd"]
    result, _, lost = kube_outcomes.figures(
        "gpuslice-default", arrivals, outcomes, fleet, replay.gpu_capacity_milli([node]), 1.0, 1.0, placements=True
    )
    assert lost == 0 and result.placements is not None
    assert [r["outcome"] for r in result.placements] == ["placed", "unschedulable", "placed"]


def test_a_gated_pod_is_no_outcome_and_an_unschedulable_one_counts_against_the_classes_it_requires() -> None:
    settings = config.Config()
    memory_label = settings.contract.label_gpu_memory_mib
    node = trace.TraceNode("t4", 64000, 262144, 2, "T4")
    fleet = kube_nodes.Fleet(None, [node], settings, sharing=True, namespace="default")  # type: ignore[arg-type]
    outcomes = kube_outcomes.Outcomes(fleet)
    gated = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    outcomes.on_event("ADDED", {"metadata": {"namespace": "default", "name": "a"}, "status": {"conditions": [gated]}})
    assert not outcomes.seen("default/a")  # waiting for the pacer, not turned away
    required = {"key": memory_label, "operator": "In", "values": ["16384", "8192"]}
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [required]}]}
    }
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    outcomes.on_event(
        "MODIFIED",
        {
            "metadata": {"namespace": "default", "name": "a"},
            "spec": {"affinity": {"nodeAffinity": affinity}},
            "status": {"conditions": [unschedulable]},
        },
    )
    assert outcomes.seen("default/a") and outcomes.unschedulable == {"default/a": "0/1 nodes"}
    # Classes in numeric order, not text order; the node's two T4s held nothing, and the waiting
    # pod would fit there.
    fits = trace.TracePod("a", 8000, 16384, 1, 500)
    assert kube_outcomes.diagnosis(outcomes, fleet, [fits]) == {
        "unschedulable_by_class": {"8192,16384": 1},
        "idle_gpus_by_class": {"15360": 2},
        "idle_gpus_a_waiting_pod_fits_by_class": {"15360": 2},
        "idle_gpus_a_waiting_pod_fits_as_pinned_by_class": {},  # pinned to 8 and 16 GiB GPUs, not 15
    }
    outcomes.pinned["default/a"] = "15360"
    assert kube_outcomes.diagnosis(outcomes, fleet, [fits])["idle_gpus_a_waiting_pod_fits_as_pinned_by_class"] == {
        "15360": 2
    }
    # Idle GPUs are stranded when the pod waiting asks more CPU, more memory, more GPUs or another
    # model than the node has.
    for stranded in (
        dataclasses.replace(fits, cpu_milli=64001),
        dataclasses.replace(fits, memory_mib=262145),
        dataclasses.replace(fits, num_gpu=3, gpu_milli=1000),
        dataclasses.replace(fits, gpu_spec=("V100M32",)),
    ):
        assert kube_outcomes.diagnosis(outcomes, fleet, [stranded])["idle_gpus_a_waiting_pod_fits_by_class"] == {}


def test_in_dra_mode_the_gpus_in_use_are_those_an_allocation_consumed() -> None:
    # The simulated device manager grants nothing in DRA mode: a GPU is in use when an allocated
    # claim consumed some of its memory (or took it whole).
    settings = config.Config()
    node = trace.TraceNode("t4", 64000, 262144, 2, "T4")
    fleet = kube_nodes.Fleet(None, [node], settings, sharing=True, namespace="default", dra=True)  # type: ignore[arg-type]
    fleet.ledger.add_slices(kube_dra.node_slices(fleet.sims["t4"].node, settings.contract, "t4"))
    assert fleet.gpus_in_use() == 0
    device = next(iter(fleet.ledger.capacity))[1]
    result = {
        "driver": settings.contract.dra_driver,
        "pool": "t4",
        "device": device,
        "consumedCapacity": {settings.contract.dra_capacity_memory: "4Gi"},
    }
    fleet.ledger.grant({"status": {"allocation": {"devices": {"results": [result]}}}})
    assert fleet.gpus_in_use() == 1


async def test_in_dra_mode_kubelet_reads_a_bound_pods_claims_only_after_its_prepare_delay() -> None:
    # --kubelet-prepare-seconds: the claim is read (and the node's labeller told) that long after
    # the bind is seen, as kubelet's pod sync prepares claims after the pod reaches the node.
    settings = config.Config()
    settings = dataclasses.replace(settings, dra=dataclasses.replace(settings.dra, enabled=True))
    node = trace.TraceNode("t4", 64000, 262144, 2, "T4")
    asked: list[float] = []

    class Api:
        async def request(self, method: str, path: str) -> dict[str, object]:
            asked.append(time.monotonic())
            return {"status": {"allocation": {"devices": {"results": []}}}}

    fleet = kube_nodes.Fleet(
        Api(),  # type: ignore[arg-type]
        [node],
        settings,
        sharing=True,
        namespace="default",
        dra=True,
        prepare_seconds=0.2,
    )
    pod = _bound("a", 36, settings.contract)
    pod["status"] = {"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "a-gpu"}]}
    bound_seen = time.monotonic()
    await fleet._admit_dra("default/a", "t4", pod)
    assert asked and asked[0] - bound_seen >= 0.2
    assert fleet.decisions["default/a"].admitted


async def test_in_dra_mode_a_placement_says_which_alternative_of_its_claim_the_allocator_took() -> None:
    settings = config.Config()
    settings = dataclasses.replace(settings, dra=dataclasses.replace(settings.dra, enabled=True))
    node = trace.TraceNode("t4", 64000, 262144, 2, "T4")
    result = {"request": "gpu/m15360", "pool": "t4", "consumedCapacity": {settings.contract.dra_capacity_memory: "4Gi"}}

    class Api:
        async def request(self, method: str, path: str) -> dict[str, object]:
            first = {"name": "gpu", "firstAvailable": [{"name": "m16384"}, {"name": "m15360"}]}
            return {
                "spec": {"devices": {"requests": [first]}},
                "status": {"allocation": {"devices": {"results": [result]}}},
            }

    fleet = kube_nodes.Fleet(Api(), [node], settings, sharing=True, namespace="default", dra=True)  # type: ignore[arg-type]
    fleet.ledger.add_slices(kube_dra.node_slices(fleet.sims["t4"].node, settings.contract, "t4"))
    result.update(driver=settings.contract.dra_driver, device=next(iter(fleet.ledger.capacity))[1])
    pod = _bound("a", 36, settings.contract)
    pod["status"] = {"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "a-gpu"}]}
    await fleet._admit_dra("default/a", "t4", pod)
    decision = fleet.decisions["default/a"]
    assert decision.admitted and decision.claim_requests == ("gpu/m15360",) and not fleet.errors
    assert decision.claim_alternatives == (1,)  # the second of its list: it fell back
    line = replay.placement_record(
        trace.TracePod("a", 8000, 16384, 1, 500), "placed", claim_requests=("gpu/m15360",), claim_alternatives=(1,)
    )
    assert line["claim_requests"] == ["gpu/m15360"] and line["claim_alternatives"] == [1]
    assert "claim_requests" not in replay.placement_record(trace.TracePod("a", 8000, 16384, 1, 500), "placed")
