"""The example manifests under examples/: valid for every Kubernetes version the chart supports, and
written in the resource names and unit size of the contract, so what docs/quotas.md says they cap
is what they cap."""

from __future__ import annotations

import pathlib

import chartkit
import pytest
import yaml

from gpuslice import contract

EXAMPLES = chartkit.REPO / "examples"
QUOTA = EXAMPLES / "quota" / "team-a.yaml"


def documents(path: pathlib.Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("kube_version", chartkit.KUBE_VERSIONS)
@pytest.mark.parametrize("path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_manifests_validate_strictly(path, kube_version):
    for obj in documents(path):
        assert chartkit.schema_errors(obj, kube_version) == [], f"{obj['kind']}/{obj['metadata']['name']}"


def test_the_team_quota_caps_the_converted_resources_in_the_contracts_units():
    c = contract.Contract()
    (quota,) = [d for d in documents(QUOTA) if d["kind"] == "ResourceQuota"]
    hard = quota["spec"]["hard"]
    # Extended resources can only be quota'd by requests.<name>.
    assert set(hard) == {
        f"requests.{c.gpu_memory_resource}",
        f"requests.{c.mig_resource('1g.10gb')}",
        f"requests.{c.mig_resource('3g.40gb')}",
    }
    units = int(hard[f"requests.{c.gpu_memory_resource}"])
    assert units * c.unit_mib == 160 * 1024  # "640 units x 256 MiB = 160 GiB" (docs/quotas.md)
    namespaces = {d["metadata"].get("namespace") for d in documents(QUOTA) if d["kind"] in ("ResourceQuota", "Pod")}
    (namespace,) = [d["metadata"]["name"] for d in documents(QUOTA) if d["kind"] == "Namespace"]
    assert namespaces == {namespace}


def test_the_example_pod_asks_in_kai_annotations_and_names_an_example_priority_class():
    (pod,) = [d for d in documents(QUOTA) if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"] == {contract.KAI_GPU_FRACTION: "0.5"}
    classes = {d["metadata"]["name"] for d in documents(QUOTA) if d["kind"] == "PriorityClass"}
    assert pod["spec"]["priorityClassName"] in classes
    # 0.5 of an H100 80GB (81,559 MiB: 318 units) is 159 units, as the comment and docs say.
    assert int(0.5 * (81559 // contract.Contract().unit_mib)) == 159
