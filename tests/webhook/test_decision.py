"""The decision annotation (webhook/decision.py): a decision too long for it is cut to its
essentials. That it never pushes a pod past the API server's annotation limit is checked through
the mutation: tests/webhook/test_mutation.py."""

from __future__ import annotations

import json

from test_mutation import CONTRACT, GPU_MEMORY

from gpuslice.webhook import decision as decision_


def test_a_long_decision_is_cut_to_its_essentials() -> None:
    long = {"resource": GPU_MEMORY, "units": 320, "containers": {f"worker-{i}": 1 for i in range(400)}}
    ops, warnings = decision_.patch_ops({"annotations": {"a": "b"}}, CONTRACT.decision_annotation, long)
    text = ops[0]["value"]
    assert len(text) <= decision_.MAX_BYTES and not warnings
    assert json.loads(text) == {"resource": GPU_MEMORY, "units": 320, "truncated": True}
