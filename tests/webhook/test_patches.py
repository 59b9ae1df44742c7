"""Building the JSON patch of a converted pod (webhook/patches.py): the node affinity merge adds an
expression once, and JSON pointers escape what RFC 6901 says to. The patches of whole pods are
checked through the mutation (tests/webhook/test_mutation.py), the pacer's gate in
tests/webhook/test_patches_pacing.py."""

from __future__ import annotations

from test_mutation import H100_MIB, pin

from gpuslice.webhook import patches


def test_merging_an_affinity_twice_adds_each_expression_once() -> None:
    expression = pin(H100_MIB)
    once = patches.merge_node_affinity(None, [expression], [])
    assert patches.merge_node_affinity(once, [expression], []) is None


def test_json_pointers_escape_slashes_and_tildes() -> None:
    assert patches.json_pointer("metadata", "annotations", "gpuslice.io/de~cision") == (
        "/metadata/annotations/gpuslice.io~1de~0cision"
    )
