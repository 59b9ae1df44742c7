"""Generated input for the admission path (hypothesis): whatever the annotations, resources,
settings and cluster, the webhook answers (allowed with a patch that applies and yields a valid
Pod, or denied with a message) and never raises; whatever the body, it is an answer or a
MalformedReview (a 400), never another exception (a 500)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from typing import Any

import jsonpatch
import jsonschema
import pytest
import test_mutation as kit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

from gpuslice import config
from gpuslice.webhook import admission

# Oldest and newest supported schema: the patch adds nothing that differs between them.
VERSIONS = ("1.29", "1.35")
CASES = 2500
# Fast and reproducible enough for CI: examples are generated from a fixed seed per run database.
FUZZ = settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@functools.cache
def pod_validator(version: str) -> jsonschema.protocols.Validator:
    """kubernetes_validate's strict Pod schema, loaded once (its validate() reloads it per call)."""
    release = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= version][-1]
    directory = f"kubernetes-json-schema/v{release}-local-strict"
    schema = kv_utils.schema_contents(f"{directory}/pod-v1.json", version)
    definitions = kv_utils.schema_contents(f"{directory}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


# --- strategies ----------------------------------------------------------------------------

NUMBERISH = st.from_regex(r"\A[-+]?[0-9０-９²_ .]{0,12}([eE][-+]?[0-9]{1,12})?(Ki|Mi|Gi|Ei|m|k|E|i)?\Z")
VALUES = st.one_of(
    st.sampled_from(
        ["0.5", "1", "0.25", "2000", "20Gi", "2e3", "mig", "main", "1", "0", "-1", "nan", "1e-400", "true", "false"]
    ),
    NUMBERISH,
    st.text(max_size=40),
    st.integers(min_value=0, max_value=10**400).map(str),
    st.builds(lambda n, c: c * n, st.integers(300, 3000), st.sampled_from(["9", "x", "é"])),
)
ANNOTATION_KEYS = st.sampled_from(
    [
        "gpu-fraction",
        "gpu-memory",
        "gpu-fraction-num-devices",
        "gpu-fraction-container-name",
        "gpuslice.io/isolation",
        "gpuslice.io/mig-or-share",
    ]
)
ANNOTATIONS = st.dictionaries(ANNOTATION_KEYS, VALUES, max_size=4)
# Resource values the API server would accept in the pod it sends (the pod reaches us valid).
QUANTITIES = st.sampled_from(["1", "2", "0", "100m", "16Gi", "1k", "1e3"])
GPUS = st.sampled_from(["0", "1", "2", "8", "9", "1e1"])  # extended resources: whole numbers
CONTAINER_RESOURCES = st.fixed_dictionaries(
    {},
    optional={
        "limits": st.dictionaries(st.sampled_from(["cpu", "memory"]), QUANTITIES)
        | st.dictionaries(st.sampled_from(["nvidia.com/gpu", "example.com/fpga"]), GPUS)
        | st.fixed_dictionaries({"gpuslice.io/gpu-memory": st.sampled_from(["1", "40"])}),
        "requests": st.dictionaries(st.sampled_from(["cpu", "memory"]), QUANTITIES),
    },
)
POD_LEVEL_REQUESTS = st.dictionaries(st.sampled_from(["cpu", "memory"]), QUANTITIES, min_size=1)
PRODUCTS = st.sampled_from([kit.H100_PRODUCT, kit.H200_PRODUCT, "Tesla-T4"])
SETTINGS = st.builds(
    lambda whole, steering, cpu_pods, dra, scheduler: dataclasses.replace(
        kit.SETTINGS,
        convert_whole_gpus=whole,
        steering=dataclasses.replace(kit.SETTINGS.steering, enabled=steering, cpu_pods=cpu_pods),
        dra=dataclasses.replace(kit.SETTINGS.dra, enabled=dra),
        scheduler_name=scheduler,
    ),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["", "gpuslice-binpack"]),
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["main", "sidecar", "init", "c3"]), min_size=1, max_size=3, unique=True))
    containers = [kit.container(n) for n in names]
    for entry in containers:
        resources = draw(CONTAINER_RESOURCES)
        limits, requests = resources.setdefault("limits", {}), resources.setdefault("requests", {})
        # As the API server's defaulting leaves them before admission: requests default to limits,
        # and an extended resource has equal requests and limits.
        requests.update(limits)
        limits.update({k: v for k, v in requests.items() if "/" in k})
        if resources:
            entry["resources"] = resources
    annotations = draw(st.one_of(st.none(), ANNOTATIONS))
    pod = kit.deployment_pod(annotations, containers=containers)
    if draw(st.booleans()):
        pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": draw(PRODUCTS)}
    if draw(st.booleans()):
        term = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    if draw(st.booleans()):
        gpus = draw(GPUS)
        pod["spec"]["initContainers"] = [
            kit.container("setup", limits={"nvidia.com/gpu": gpus}, requests={"nvidia.com/gpu": gpus})
        ]
        if draw(st.booleans()):  # a sidecar: counted with the containers (gpuslice.podrequests)
            pod["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    if draw(st.booleans()):  # a RuntimeClass's overhead
        pod["spec"]["overhead"] = {"cpu": draw(QUANTITIES), "memory": "64Mi"}
    if draw(st.booleans()):  # pod-level requests (PodLevelResources): replace the containers' CPU and memory
        pod["spec"]["resources"] = {"requests": draw(POD_LEVEL_REQUESTS)}
    return pod


def review_of(pod: Any, **request: Any) -> dict[str, Any]:
    body = {
        "uid": "fuzz",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "object": pod,
        **request,
    }
    return {"apiVersion": admission.API_VERSION, "kind": admission.KIND, "request": body}


VIEWS = {True: kit.empty_view(), False: kit.make_view()}  # mutate only reads the view


# --- properties ----------------------------------------------------------------------------


@FUZZ
@given(pod=pods(), settings_=SETTINGS, empty=st.booleans())
def test_every_pod_gets_a_valid_patch_or_a_denial_with_a_message(
    pod: dict[str, Any], settings_: config.Config, empty: bool
) -> None:
    view = VIEWS[empty]  # the prefix and unit are the defaults in every generated setting
    body = json.dumps(review_of(pod)).encode()
    result = admission.review(body, settings=settings_, cluster=view)  # any exception fails the test
    response = result.response["response"]
    assert response["uid"] == "fuzz"
    if not response["allowed"]:
        assert response["status"]["message"].strip() and "patch" not in response
        assert len(response["status"]["message"]) < 2000
        return
    if "patch" not in response:
        return
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    # DRA mode needs Kubernetes 1.34+ (the flattened PodResourceClaim), and pod-level requests a schema
    # that has them; device-plugin mode runs on all.
    newest_only = settings_.dra.enabled or "resources" in pod["spec"]
    for version in VERSIONS[-1:] if newest_only else VERSIONS:
        errors = sorted(pod_validator(version).iter_errors(patched), key=str)
        assert not errors, f"Kubernetes {version}: {errors[0].message}"
    kit.check_extended_resources(patched)
    annotations = patched["metadata"].get("annotations") or {}
    assert sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) <= 256 * 1024


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=25,
)
POD_KEYS = st.sampled_from(["metadata", "spec", "annotations", "containers", "resources", "limits", "affinity", "name"])
POD_LIKE = st.recursive(
    JSON,
    lambda children: st.dictionaries(POD_KEYS, children, max_size=4) | st.lists(children, max_size=3),
    max_leaves=30,
)


@FUZZ
@given(body=st.one_of(JSON, st.builds(review_of, POD_LIKE), st.binary(max_size=64)))
def test_any_body_is_answered_or_refused_as_malformed(body: Any) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        result = admission.review(raw, settings=kit.SETTINGS, cluster=VIEWS[False])
    except admission.MalformedReview as exc:
        assert str(exc)
        return
    response = result.response["response"]
    assert response["allowed"] or response["status"]["message"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_cached_validator_checks_the_strict_pod_schema(version: str) -> None:
    pod = kit.deployment_pod({"gpu-fraction": "0.5"})
    assert not list(pod_validator(version).iter_errors(pod))
    pod["spec"]["containers"][0]["resources"] = {"limit": {"nvidia.com/gpu": "1"}}
    assert list(pod_validator(version).iter_errors(pod))
