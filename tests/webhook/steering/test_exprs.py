"""The nodeSelector building blocks the steering families write with (webhook/steering/exprs.py)."""

from __future__ import annotations

from gpuslice.webhook.steering import exprs


def test_gt_and_lt_write_one_integer_value_as_a_string() -> None:
    assert exprs.gt("gpuslice.io/free", 3) == {"key": "gpuslice.io/free", "operator": "Gt", "values": ["3"]}
    assert exprs.lt("gpuslice.io/free", -1) == {"key": "gpuslice.io/free", "operator": "Lt", "values": ["-1"]}


def test_a_term_carries_its_weight_and_its_expressions_in_order() -> None:
    first, second = exprs.gt("a", 1), exprs.lt("b", 9)
    assert exprs.term(30, first, second) == {"weight": 30, "preference": {"matchExpressions": [first, second]}}
    assert exprs.term(5) == {"weight": 5, "preference": {"matchExpressions": []}}


def test_the_largest_bound_is_far_inside_the_int64_the_api_server_reads() -> None:
    assert exprs.MAX_BOUND * 1000 < 2**63 - 1
