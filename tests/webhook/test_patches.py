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


def test_alternatives_are_crossed_with_the_pods_own_required_terms() -> None:
    # (zone a OR zone b) AND (class x OR class y): four terms, each one zone and one class; the
    # pod's preferred terms and other affinities kept, an expression it has already not repeated.
    zone = [{"key": "zone", "operator": "In", "values": [z]} for z in ("a", "b")]
    own = {
        "podAffinity": {"x": 1},
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [zone[0]]},
                    {"matchExpressions": [zone[1]], "matchFields": [1]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
        },
    }
    merged = patches.merge_node_affinity_any_of(own, [[pin(H100_MIB)], [pin(H100_MIB + 1), zone[0]]], [{"weight": 2}])
    terms = merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [zone[0], pin(H100_MIB)]},
        {"matchExpressions": [zone[0], pin(H100_MIB + 1)]},
        {"matchExpressions": [zone[1], pin(H100_MIB)], "matchFields": [1]},
        {"matchExpressions": [zone[1], pin(H100_MIB + 1), zone[0]], "matchFields": [1]},
    ]
    assert merged["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1}, {"weight": 2}]
    assert merged["podAffinity"] == {"x": 1}
    assert own["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0] == {
        "matchExpressions": [zone[0]]
    }  # the pod's own affinity is not changed in place
    bare = patches.merge_node_affinity_any_of(None, [[pin(H100_MIB)], [pin(H100_MIB + 1)]], [])
    assert bare == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [pin(H100_MIB)]}, {"matchExpressions": [pin(H100_MIB + 1)]}]
            }
        }
    }
