"""The node labels the webhook and the pacer steer by (node/labels.py): which changes over-promise
and so are written at once, inside the labeller's rate limit."""

from __future__ import annotations

from gpuslice import contract
from gpuslice.node import labels

CONTRACT = contract.Contract()


def test_what_is_taken_over_promises_and_what_is_given_back_does_not():
    written = {
        CONTRACT.label_free_units: "636",
        CONTRACT.label_free_partial_block_units: "100",
        CONTRACT.label_free_cpu_milli: "26000",
        CONTRACT.label_free_memory_mib: "1000",
        CONTRACT.label_placement_score: "50",
    }
    for key in (CONTRACT.label_free_partial_block_units, CONTRACT.label_free_cpu_milli, CONTRACT.label_free_memory_mib):
        assert labels.over_promises(written, {key: "10"}, CONTRACT), key
        assert not labels.over_promises(written, {key: "99999"}, CONTRACT), key
    assert labels.over_promises(written, {CONTRACT.label_free_units: None}, CONTRACT)  # removed: read as free
    assert not labels.over_promises(written, {CONTRACT.label_placement_score: "10"}, CONTRACT)
