"""Pods written for NVIDIA's device plugin (the mixed strategy's nvidia.com/mig-<profile>) and for
HAMi (nvidia.com/gpumem, gpumem-percentage, gpucores) as their projects document them: converted to
gpuslice's resources, or refused with what to write instead (webhook/foreign.py); and KAI's
scheduler name rewritten on every pod the webhook is given, converted or not."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_mutation import (
    CONTRACT,
    GPU_MEMORY,
    SETTINGS,
    container,
    convert,
    decision,
    deployment_pod,
    make_view,
    required_terms,
    units_of,
)

from gpuslice.webhook import conversions, dra_claims, mutation

DRA = dataclasses.replace(SETTINGS, dra=dataclasses.replace(SETTINGS.dra, enabled=True))


def expressions(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for term in required_terms(pod) for e in term["matchExpressions"]]


# --- NVIDIA's MIG resources ----------------------------------------------------------------------


def test_nvidia_mig_resources_become_gpuslice_mig_devices_of_the_same_profile():
    pod = deployment_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "2"})])
    outcome, patched = convert(pod)
    assert outcome.allowed and outcome.kind == conversions.KIND_MIG
    mig = CONTRACT.mig_resource("1g.10gb")
    assert units_of(patched) == {"requests": {mig: "2"}, "limits": {mig: "2"}}
    assert decision(patched)["converted"] == "nvidia.com/mig-1g.10gb" and decision(patched)["units"] == 2
    # two devices of the profile: only nodes with at least two free are eligible
    assert {"key": CONTRACT.label_mig_free("1g.10gb"), "operator": "Gt", "values": ["1"]} in expressions(patched)


def test_a_mig_profile_no_node_offers_is_refused_naming_those_offered():
    outcome, _ = convert(deployment_pod(containers=[container(limits={"nvidia.com/mig-7g.80gb": "1"})]))
    assert not outcome.allowed
    assert "no node of the cluster offers MIG profile '7g.80gb'" in outcome.message
    assert "1g.10gb, 2g.20gb, 3g.40gb" in outcome.message


@pytest.mark.parametrize(
    ("containers", "said"),
    [
        ([container(limits={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"})], "cannot be mixed in one pod"),
        (
            [container("a", limits={"nvidia.com/mig-1g.10gb": "1"}), container("b", limits={"nvidia.com/gpu": "1"})],
            "cannot be mixed in one pod",
        ),
        (
            [container(limits={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"})],
            "one MIG profile for one container per pod",
        ),
        ([container(limits={"nvidia.com/mig-1g.10gb": "one"})], "is not a whole number"),
    ],
    ids=["with-whole-gpus", "whole-gpus-in-another-container", "two-profiles", "not-a-count"],
)
def test_nvidia_mig_requests_gpuslice_cannot_keep_are_refused_with_advice(containers, said):
    outcome, _ = convert(deployment_pod(containers=containers))
    assert not outcome.allowed and said in outcome.message


def test_in_dra_mode_nvidia_mig_requests_become_a_claim_for_as_many_mig_devices():
    pod = deployment_pod(containers=[container(limits={"nvidia.com/mig-1g.10gb": "2"})])
    outcome = mutation.mutate(pod, settings=DRA, cluster=make_view())
    assert outcome.allowed
    (template,) = outcome.objects
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == CONTRACT.dra_mig_device_class
    assert request["exactly"]["count"] == 2
    assert '"1g.10gb"' in request["exactly"]["selectors"][0]["cel"]["expression"]
    (resources,) = [op["value"] for op in outcome.patch if op["path"].endswith("/resources")]
    assert "nvidia.com/mig-1g.10gb" not in str(resources) and resources["claims"] == [{"name": dra_claims.CLAIM_NAME}]


# --- HAMi's resources ----------------------------------------------------------------------------


def test_hami_memory_becomes_a_share_of_that_many_mib_and_hamis_names_go():
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
    outcome, patched = convert(deployment_pod(containers=[container(limits=limits)]))
    assert outcome.allowed and outcome.kind == conversions.KIND_MEMORY
    assert units_of(patched) == {"requests": {GPU_MEMORY: "12"}, "limits": {GPU_MEMORY: "12"}}  # ceil(3000 / 256)
    assert decision(patched)["requestedMiB"] == 3000 and decision(patched)["annotation"] == "nvidia.com/gpumem"


def test_hami_memory_as_the_api_server_canonicalises_it_is_still_mib():
    """kube-apiserver sends `3000` as `3k` (a quantity's canonical form): HAMi reads 3000 MiB."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"}
    _, patched = convert(deployment_pod(containers=[container(limits=limits)]))
    assert units_of(patched)["limits"] == {GPU_MEMORY: "12"}


def test_hami_memory_percentage_becomes_that_fraction_of_one_gpu():
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}
    outcome, patched = convert(deployment_pod(containers=[container(limits=limits)]))
    assert outcome.allowed and outcome.kind == conversions.KIND_FRACTION
    assert decision(patched)["fraction"] == 0.25
    (name,) = units_of(patched)["limits"]
    assert name == GPU_MEMORY


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
            "gpuslice does not cap a pod's GPU cores",
        ),
        ({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000"}, "gpuslice keeps a share on one GPU"),
        (
            {"nvidia.com/gpumem": "3000", "nvidia.com/gpumem-percentage": "50"},
            "sets both nvidia.com/gpumem and nvidia.com/gpumem-percentage",
        ),
        ({"nvidia.com/gpumem-percentage": "150"}, "a whole percentage from 1 to 100"),
        ({"nvidia.com/gpumem": "lots"}, "is not a whole number above 0"),
    ],
    ids=["gpucores", "several-gpus", "memory-and-percentage", "percentage-over-100", "not-a-quantity"],
)
def test_hami_requests_gpuslice_cannot_honour_are_refused_saying_how_to_write_them(limits, said):
    outcome, _ = convert(deployment_pod(containers=[container(limits=limits)]))
    assert not outcome.allowed and said in outcome.message, outcome.message


def test_a_kai_annotation_beside_hami_resources_is_refused_rather_than_half_converted():
    pod = deployment_pod({"gpu-fraction": "0.5"}, containers=[container(limits={"nvidia.com/gpumem": "3000"})])
    outcome, _ = convert(pod)
    assert not outcome.allowed and "choose one" in outcome.message and "nvidia.com/gpumem" in outcome.message


def test_in_dra_mode_a_hami_share_becomes_a_claim_and_hamis_names_go():
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}
    pod = deployment_pod(containers=[container(limits=limits)])
    outcome = mutation.mutate(pod, settings=DRA, cluster=make_view())
    assert outcome.allowed
    (template,) = outcome.objects
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"]["requests"]["gpu.gpuslice.io/memory"] == "4096Mi"
    (resources,) = [op["value"] for op in outcome.patch if op["path"].endswith("/resources")]
    assert "nvidia.com/gpu" not in str(resources)


def test_without_whole_gpu_conversion_other_systems_names_are_left_alone():
    settings = dataclasses.replace(SETTINGS, convert_whole_gpus=False)
    for limits in ({"nvidia.com/mig-1g.10gb": "1"}, {"nvidia.com/gpumem": "3000"}):
        outcome, _ = convert(deployment_pod(containers=[container(limits=limits)]), settings=settings)
        assert outcome.allowed and outcome.kind != conversions.KIND_MIG and not outcome.decision


# --- KAI's scheduler -----------------------------------------------------------------------------


def test_a_cpu_pod_naming_kais_scheduler_gets_one_that_exists_and_says_so():
    pod = deployment_pod(containers=[container(requests={"cpu": "1"})], schedulerName="kai-scheduler")
    outcome, patched = convert(pod)
    assert outcome.allowed and patched["spec"]["schedulerName"] == "default-scheduler"
    assert "gpuslice: schedulerName kai-scheduler rewritten to default-scheduler" in outcome.warnings


def test_a_pod_the_webhook_leaves_unconverted_still_loses_kais_scheduler():
    pod = deployment_pod(
        {"gpu-fraction-container-name": "main"}, containers=[container()], schedulerName="kai-scheduler"
    )
    outcome, patched = convert(pod)
    assert outcome.allowed and outcome.kind == "" and patched["spec"]["schedulerName"] == "default-scheduler"


def test_a_converted_pod_naming_kais_scheduler_is_rewritten_once():
    pod = deployment_pod({"gpu-memory": "2000"}, schedulerName="kai-scheduler")
    outcome, patched = convert(pod)
    assert [op for op in outcome.patch if op["path"] == "/spec/schedulerName"] == [
        {"op": "add", "path": "/spec/schedulerName", "value": "default-scheduler"}
    ]
    assert decision(patched)["schedulerNameWas"] == "kai-scheduler"


# --- KAI's mps annotation ------------------------------------------------------------------------


@pytest.mark.parametrize(("enabled", "said"), [(False, "is ignored"), (True, "is not needed")])
def test_kais_mps_annotation_is_answered_with_what_gpuslice_does_about_it(enabled, said):
    settings = dataclasses.replace(SETTINGS, mps=dataclasses.replace(SETTINGS.mps, enabled=enabled))
    outcome, _ = convert(deployment_pod({"gpu-fraction": "0.5", "mps": "true"}), settings=settings)
    assert outcome.allowed and any(said in w and "mps='true'" in w for w in outcome.warnings), outcome.warnings
