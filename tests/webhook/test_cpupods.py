"""CPU-pod steering (webhook/cpupods.py): the answer key of a pod that asks for no device leaves out
its amounts, so that CPU pods of any size share one remembered answer, while a GPU pod's key keeps
them (its patch carries them). The steering such a pod gets is checked through the mutation:
tests/webhook/test_mutation.py."""

from __future__ import annotations

import json
from typing import Any

import test_admission_fuzz as fuzz
import test_mutation as kit

from gpuslice import config
from gpuslice.webhook import cpupods, decoding


def test_the_key_leaves_out_amounts_only_for_a_pod_that_asks_for_no_device() -> None:
    rules = cpupods.key_rules(config.Config().contract)

    def key(annotations: dict[str, str], **amounts: Any) -> bytes | None:
        containers = [kit.container(requests=amounts, limits={"memory": "1Gi"}), kit.container(name="log")]
        pod = kit.deployment_pod(annotations, containers=containers)
        body = json.dumps(fuzz.review_of(pod, uid="u-1")).encode()
        decoded = decoding.fields(body, rules=rules)
        assert decoded is not None and decoded.key is not None
        kept = decoded.document()[0]["request"]["object"]["spec"]["containers"][0]["resources"]
        assert kept == {"requests": amounts, "limits": {"memory": "1Gi"}}  # the document keeps them
        return decoded.key

    cpu = key({}, cpu="2", memory="4Gi")
    assert cpu == key({}, cpu="3500m", memory="1Ti")  # amounts left out
    assert cpu != key({}, cpu=2, memory="4Gi")  # ... their JSON type kept
    assert cpu != key({}, cpu="2")  # ... and the names
    assert cpu != key({}, cpu="2", memory="4Gi", **{"example.com/fpga": "1"})
    gpu = key({"gpu-fraction": "0.5"}, cpu="2", memory="4Gi")
    assert gpu != key({"gpu-fraction": "0.5"}, cpu="3", memory="4Gi")  # a GPU pod's patch carries its amounts
