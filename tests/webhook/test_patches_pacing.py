"""With `pacing.enabled` the webhook gates the pods it changes while a pacer is alive (the gate and
the decision's `notGated`: webhook/patches.py, `gate_ops`), for the pacer to release in arrival
order; the device plugin's labeller writes every allocation at once (pacer/, docs/steering.md).
Whether a pacer is alive is read from its Lease: tests/webhook/test_pacerlease.py."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json

import jsonpatch
import kubernetes_validate
import orjson
import pytest
import reviewkit
from test_mutation import deployment_pod, make_view

from gpuslice import config
from gpuslice.node import labels as node_labels
from gpuslice.webhook import admission, cluster, mutation

PACED = dataclasses.replace(config.Config(), pacing=config.PacingConfig(enabled=True))
CONTRACT = PACED.contract
GATE = {"name": CONTRACT.pacing_gate}


def paced_view(*, pacer_alive: bool = True) -> cluster.ClusterView:
    view = make_view(settings=PACED)
    view.set_pacer("" if pacer_alive else "no pacer alive: Lease gpuslice/gpuslice-pacer not renewed within 15 s")
    return view


def mutated(pod: dict, settings: config.Config = PACED, *, pacer_alive: bool = True) -> dict:
    outcome = mutation.mutate(pod, settings=settings, cluster=paced_view(pacer_alive=pacer_alive))
    assert outcome.allowed, outcome.message
    return jsonpatch.apply_patch(copy.deepcopy(pod), outcome.patch)


def decision(pod: dict) -> dict:
    return json.loads(pod["metadata"]["annotations"][CONTRACT.decision_annotation])


@pytest.mark.parametrize(
    "annotations",
    [{"gpu-fraction": "0.5"}, {"gpu-memory": "2000"}, {"gpu-memory": "10000", CONTRACT.isolation_annotation: "mig"}],
    ids=["fraction", "memory", "mig"],
)
def test_a_converted_pod_is_gated_and_its_decision_says_so(annotations: dict) -> None:
    after = mutated(deployment_pod(annotations))
    assert after["spec"]["schedulingGates"] == [GATE]
    assert CONTRACT.pacing_gate in after["metadata"]["annotations"][CONTRACT.decision_annotation]
    kubernetes_validate.validate(after, "1.31", strict=True)


def test_a_cpu_pod_the_webhook_steers_is_gated_to_keep_its_place_in_line() -> None:
    after = mutated(deployment_pod())
    assert after["spec"]["schedulingGates"] == [GATE]
    assert after["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]


def test_without_pacing_nothing_is_gated() -> None:
    for pod in (deployment_pod({"gpu-fraction": "0.5"}), deployment_pod()):
        assert "schedulingGates" not in mutated(pod, config.Config())["spec"]


@pytest.mark.parametrize(
    "pod", [deployment_pod({"gpu-fraction": "0.5"}), deployment_pod()], ids=["converted", "cpu-pod"]
)
def test_with_no_pacer_alive_nothing_is_gated(pod: dict) -> None:
    after = mutated(pod, pacer_alive=False)
    assert "schedulingGates" not in after["spec"]
    assert after["spec"]["affinity"]  # converted or steered all the same


def test_the_decision_of_a_pod_left_ungated_says_no_pacer_was_alive() -> None:
    after = mutated(deployment_pod({"gpu-fraction": "0.5"}), pacer_alive=False)
    assert "gated" not in decision(after)
    assert decision(after)["notGated"].startswith("no pacer alive: Lease gpuslice/gpuslice-pacer")
    assert "notGated" not in decision(mutated(deployment_pod({"gpu-fraction": "0.5"})))


def test_a_webhook_without_a_cluster_gates_nothing() -> None:
    view = make_view(settings=PACED)  # never told of a pacer: main() reads no Lease without a cluster
    outcome = mutation.mutate(deployment_pod({"gpu-fraction": "0.5"}), settings=PACED, cluster=view)
    assert not any(op["path"].startswith("/spec/schedulingGates") for op in outcome.patch)
    assert outcome.decision is not None and "no pacer" in outcome.decision["notGated"]


def test_other_gates_stay_and_a_reinvocation_adds_ours_once() -> None:
    pod = deployment_pod({"gpu-fraction": "0.5"}, schedulingGates=[{"name": "example.com/quota"}])
    after = mutated(pod)
    assert after["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, GATE]
    again = mutation.mutate(after, settings=PACED, cluster=paced_view())
    assert again.patch == []  # already converted: left alone


def test_a_pod_that_names_its_node_is_converted_but_not_gated() -> None:
    # The API server refuses scheduling gates on a pod with spec.nodeName.
    after = mutated(deployment_pod({"gpu-fraction": "0.5"}, nodeName="n1"))
    assert CONTRACT.gpu_memory_resource in after["spec"]["containers"][0]["resources"]["limits"]
    assert "schedulingGates" not in after["spec"]
    assert CONTRACT.pacing_gate not in after["metadata"]["annotations"][CONTRACT.decision_annotation]


def test_labellers_write_every_lower_free_total_at_once() -> None:
    # The pacer reads a node as lagging until its free total counts every pod bound to it: an
    # allocation that leaves the largest block as it was must not wait for the rate limit.
    written = {CONTRACT.label_free_units: "636", CONTRACT.label_free_block_units: "318"}
    change = {CONTRACT.label_free_units: "445"}
    assert node_labels.over_promises(written, change, CONTRACT)
    assert not node_labels.over_promises(written, {CONTRACT.label_free_units: "700"}, CONTRACT)


def test_the_controller_reads_only_the_names_and_its_own_sections() -> None:
    read = {f.path for f in config.FIELDS if config.reads("controller", f)}
    assert read == {
        "resourcePrefix",
        "memoryUnitMiB",
        "requeue.enabled",
        "requeue.maxAttempts",
        "requeue.backoffSeconds",
        "pacing.enabled",
        "pacing.maxInFlight",
        "pacing.bindTimeoutSeconds",
        "pacing.lagTimeoutSeconds",
        "controller.leaseName",
        "controller.leaseNamespace",
        "controller.leaseSeconds",
    }
    lease = {"controller.leaseName", "controller.leaseNamespace", "controller.leaseSeconds"}
    device_plugin = {f.path for f in config.FIELDS if config.reads("device-plugin", f)}
    assert "pacing.enabled" in device_plugin and "pacing.maxInFlight" not in device_plugin
    assert not lease & device_plugin and not {f for f in device_plugin if f.startswith("requeue.")}
    webhook = {f.path for f in config.FIELDS if config.reads("webhook", f)}
    assert lease <= webhook  # with pacing on, it gates only while a leader renews the Lease
    assert not {f for f in webhook if f.startswith("requeue.")}  # the webhook requeues nothing


def test_a_review_as_bytes_keeps_the_pods_own_gates() -> None:
    # The typed decode reads only the fields the webhook uses: the pod's gates must be one of them,
    # or the gate op would replace them.
    pod = deployment_pod({"gpu-fraction": "0.5"}, schedulingGates=[{"name": "example.com/quota"}])
    body = orjson.dumps(reviewkit.pod_create(pod, uid="u-1"))
    result = admission.review(body, settings=PACED, cluster=paced_view())
    patch = orjson.loads(base64.b64decode(result.response["response"]["patch"]))
    after = jsonpatch.apply_patch(copy.deepcopy(pod), patch)
    assert after["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, GATE]


def test_pacing_in_dra_mode_is_refused_at_start_and_gates_nothing_if_forced() -> None:
    with pytest.raises(config.ConfigError, match="pacing.enabled: needs device-plugin mode"):
        config.load(overrides={"pacing.enabled": True, "dra.enabled": True}, environ={})
    # The replay switches modes after loading: a CPU pod must still not wait for a pacer that never runs.
    forced = dataclasses.replace(PACED, dra=dataclasses.replace(PACED.dra, enabled=True))
    assert "schedulingGates" not in mutated(deployment_pod(), forced)["spec"]
