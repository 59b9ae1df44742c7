"""Each steering family on its own (webhook/steering/families.py): the terms it writes for a request,
that every weight it writes is in its band, and that its terms move only with the request fields it
says it reads."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuslice import config
from gpuslice.webhook import steering
from gpuslice.webhook.steering import families
from gpuslice.webhook.steering.families import Family

CONTRACT = config.Config().contract
W = steering.WEIGHTS
SHARE = steering.Request(units=40, units_per_gpu=160, largest_node_gpus=8, cpu_milli=6000, cpu_per_gpu_milli=12000)
WHOLE = steering.Request(
    gpus=2, whole_gpus=True, units_per_gpu=160, largest_node_gpus=8, cpu_milli=30000, memory_mib=65536
)
MIG = steering.Request(mig_profile="1g.10gb", gpus=2)
FAMILIES: list[Family] = [
    families.FEASIBLE,
    families.SHARE_FIT,
    families.FREE_GPUS,
    families.WHOLE_GPU_FIT,
    families.KEEP_WHOLE_NODE,
    families.PLACEMENT_SCORE,
    families.MIG_FIT,
    families.CPU_BALANCE,
    families.HOST_FIT,
]


def exprs(*triples: tuple[str, str, int]) -> list[dict[str, Any]]:
    return [{"key": k, "operator": op, "values": [str(v)]} for k, op, v in triples]


def term(weight: int, *triples: tuple[str, str, int]) -> dict[str, Any]:
    return {"weight": weight, "preference": {"matchExpressions": exprs(*triples)}}


def test_feasible_requires_room_for_each_kind_and_prefers_every_feasible_node_at_full_weight() -> None:
    f = families.FEASIBLE
    assert f.required(SHARE, CONTRACT) == exprs((CONTRACT.label_free_block_units, "Gt", 39))
    assert f.required(WHOLE, CONTRACT) == exprs((CONTRACT.label_free_gpus, "Gt", 1))
    assert f.required(MIG, CONTRACT) == exprs((CONTRACT.label_mig_free("1g.10gb"), "Gt", 1))
    assert f.preferred(SHARE, CONTRACT) == [term(W.fits, (CONTRACT.label_free_block_units, "Gt", 39))]


def test_share_fit_grades_the_slack_on_a_partly_used_gpu_by_tenths_and_quarters_of_one() -> None:
    partial = CONTRACT.label_free_partial_block_units
    assert families.SHARE_FIT.preferred(SHARE, CONTRACT) == [
        term(W.tight_fit, (partial, "Gt", 39), (partial, "Lt", 56)),
        term(W.close_fit, (partial, "Gt", 55), (partial, "Lt", 80)),
        term(W.loose_fit, (partial, "Gt", 79)),
    ]
    unknown = families.SHARE_FIT.preferred(dataclasses.replace(SHARE, units_per_gpu=0), CONTRACT)
    assert unknown[0] == term(W.tight_fit, (partial, "Gt", 39), (partial, "Lt", 50))  # graded by the request


def test_free_gpus_prefers_nodes_with_few_whole_gpus_free_only_where_no_partly_used_gpu_fits() -> None:
    partial, free = CONTRACT.label_free_partial_block_units, CONTRACT.label_free_gpus
    assert families.FREE_GPUS.preferred(SHARE, CONTRACT) == [
        term(W.one_free_gpu, (partial, "Lt", 40), (free, "Lt", 2)),
        term(W.few_free_gpus, (partial, "Lt", 40), (free, "Gt", 1), (free, "Lt", 4)),
    ]


def test_whole_gpu_fit_prefers_nodes_with_exactly_or_nearly_as_many_gpus_free() -> None:
    free = CONTRACT.label_free_gpus
    assert families.WHOLE_GPU_FIT.preferred(WHOLE, CONTRACT) == [
        term(W.exact_gpus, (free, "Lt", 3)),
        term(W.near_gpus, (free, "Gt", 2), (free, "Lt", 5)),
    ]


def test_keep_whole_node_only_for_a_pod_smaller_than_the_largest_node() -> None:
    kept = [term(W.keep_whole_node, (CONTRACT.label_free_gpus, "Lt", 8))]
    assert families.KEEP_WHOLE_NODE.preferred(SHARE, CONTRACT) == kept
    assert families.KEEP_WHOLE_NODE.preferred(WHOLE, CONTRACT) == kept
    assert families.KEEP_WHOLE_NODE.preferred(dataclasses.replace(WHOLE, gpus=8), CONTRACT) == []
    assert families.KEEP_WHOLE_NODE.preferred(dataclasses.replace(SHARE, largest_node_gpus=0), CONTRACT) == []


def test_placement_score_weighs_less_than_any_step_between_fit_grades() -> None:
    score = CONTRACT.label_placement_score
    assert families.PLACEMENT_SCORE.preferred(SHARE, CONTRACT) == [
        term(W.score_high, (score, "Gt", 69)),
        term(W.score_mid, (score, "Gt", 39), (score, "Lt", 70)),
    ]
    assert max(families.PLACEMENT_SCORE.weights) < min(W.close_fit - W.loose_fit, W.one_free_gpu - W.few_free_gpus)


def test_mig_fit_prefers_the_last_free_slices_of_the_profile() -> None:
    free = CONTRACT.label_mig_free("1g.10gb")
    assert families.MIG_FIT.preferred(MIG, CONTRACT) == [
        term(W.last_mig, (free, "Lt", 2)),
        term(W.few_mig, (free, "Gt", 1), (free, "Lt", 4)),
    ]


def test_cpu_balance_matches_the_nodes_whose_balance_is_near_the_pods_need() -> None:
    # 40 of 160 units: a quarter GPU, 3000 millicores expected; the pod asks 6000: need +3000.
    spare, short, free = CONTRACT.label_spare_cpu_milli, CONTRACT.label_short_cpu_milli, CONTRACT.label_free_gpus
    assert families.CPU_BALANCE.preferred(SHARE, CONTRACT) == [
        term(W.cpu_balance_close, (spare, "Lt", 6001), (short, "Lt", 1), (free, "Lt", 8)),
        term(W.cpu_balance_near, (spare, "Lt", 15001), (short, "Lt", 9001), (free, "Lt", 8)),
    ]
    for off in (dataclasses.replace(SHARE, cpu_per_gpu_milli=0), dataclasses.replace(SHARE, cpu_milli=-1), MIG):
        assert families.CPU_BALANCE.preferred(off, CONTRACT) == []
    assert families.CPU_BALANCE.preferred(dataclasses.replace(SHARE, units_per_gpu=0), CONTRACT) == []


def test_host_fit_only_for_whole_gpus_with_a_memory_request() -> None:
    free, memory = CONTRACT.label_free_gpus, CONTRACT.label_free_memory_mib
    assert families.HOST_FIT.preferred(WHOLE, CONTRACT) == [term(W.host_fit, (free, "Lt", 3), (memory, "Lt", 98305))]
    assert families.HOST_FIT.preferred(SHARE, CONTRACT) == []
    assert families.HOST_FIT.preferred(dataclasses.replace(WHOLE, memory_mib=10**16), CONTRACT) == []


def test_cpu_pods_grade_nearly_full_nodes_only_with_the_band_on() -> None:
    free = CONTRACT.label_free_gpus
    off = families.CPU_PODS.preferred(CONTRACT, 0)
    assert off == [
        {"weight": W.cpu_pod_cpu_node, "preference": {"matchExpressions": [{"key": free, "operator": "DoesNotExist"}]}},
        term(W.cpu_pod_no_free_gpu, (free, "Lt", 1)),
    ]
    on = families.CPU_PODS.preferred(CONTRACT, 8192)
    assert [t["weight"] for t in on] == [W.cpu_pod_cpu_node, *W.cpu_pod_nearly_full, W.cpu_pod_no_free_gpu]
    assert {t["weight"] for t in on} <= set(families.CPU_PODS.weights)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: type(f).__name__)
def test_a_familys_weights_are_its_band(family: Family) -> None:
    for request in (SHARE, WHOLE, MIG):
        if family is families.SHARE_FIT and request is not SHARE or family is families.FREE_GPUS and request is MIG:
            continue
        for written in family.preferred(request, CONTRACT):
            assert written["weight"] in family.weights


# Values to move each request field to: a field a family does not read must not move its terms.
_OTHER = {
    "units": 20,
    "gpus": 3,
    "whole_gpus": False,
    "mig_profile": "2g.20gb",
    "units_per_gpu": 100,
    "largest_node_gpus": 4,
    "cpu_milli": 1000,
    "memory_mib": 1024,
    "cpu_per_gpu_milli": 8000,
}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: type(f).__name__)
def test_a_familys_terms_move_only_with_the_fields_it_reads(family: Family) -> None:
    assert family.reads <= set(_OTHER)
    for request in (SHARE, WHOLE, MIG):
        if family is families.MIG_FIT and request is not MIG:
            continue
        before = family.preferred(request, CONTRACT), family.required(request, CONTRACT)
        for field, value in _OTHER.items():
            if field not in family.reads:
                moved = dataclasses.replace(request, **{field: value})
                assert (family.preferred(moved, CONTRACT), family.required(moved, CONTRACT)) == before, field


def test_the_families_built_once_per_request_read_only_its_identity() -> None:
    for family in steering.CACHED:
        assert not family.reads & {"cpu_milli", "memory_mib"}
    assert {"cpu_milli"} <= families.CPU_BALANCE.reads and {"memory_mib"} <= families.HOST_FIT.reads
