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


def test_the_cpu_per_free_gpu_counts_free_memory_in_gpus_and_is_0_when_none_is_free(demo_node):
    # The demo node's two shared H100s (its third GPU is in MIG mode), 318 units each: one full, a
    # quarter of the other in use, so 0.75 of a GPU free (units rounded as the label's reader would).
    first, second = (g.uuid for g in demo_node.memory_gpus)
    key = CONTRACT.label_cpu_per_free_gpu_milli
    partly = labels.node_labels(demo_node, CONTRACT, allocated={first: 318, second: 80}, headroom=(12_000, 1000))
    assert partly[key] == str(round(12_000 / (238 / 318)))
    full = labels.node_labels(demo_node, CONTRACT, allocated={first: 318, second: 318}, headroom=(12_000, 1000))
    assert full[key] == "0"  # no share fits: a fallback's Gt term never matches it
    assert key not in labels.node_labels(demo_node, CONTRACT, allocated={first: 318})  # no headroom known
    assert labels.cpu_per_free_gpu_labels(CONTRACT, 10**9, 1 / 10**6) == {key: "9" * 12}  # what a label holds
